//! GeoIP person properties for flag evaluation, from a MaxMind-format (GeoLite2-City) database.

use std::net::IpAddr;
use std::path::Path;

use serde_json::{Map, Value};

pub struct GeoIp {
    reader: maxminddb::Reader<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot open the GeoIP database {path}: {source}")]
pub struct GeoIpError {
    path: String,
    #[source]
    source: maxminddb::MaxMindDBError,
}

impl GeoIp {
    pub fn open(path: &Path) -> Result<GeoIp, GeoIpError> {
        maxminddb::Reader::open_readfile(path)
            .map(|reader| GeoIp { reader })
            .map_err(|source| GeoIpError {
                path: path.display().to_string(),
                source,
            })
    }

    /// The `$geoip_*` properties of `ip`; empty for loopback, private and unknown addresses.
    pub fn properties(&self, ip: IpAddr) -> Map<String, Value> {
        let mut out = Map::new();
        let private = match ip {
            IpAddr::V4(v4) => {
                v4.is_loopback() || v4.is_private() || v4.is_link_local() || v4.is_unspecified()
            }
            IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified(),
        };
        if private {
            return out;
        }
        let Ok(city) = self.reader.lookup::<maxminddb::geoip2::City>(ip) else {
            return out;
        };
        let name = |names: Option<std::collections::BTreeMap<&str, &str>>| {
            names.and_then(|n| n.get("en").map(|s| s.to_string()))
        };
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                out.insert(key.to_string(), Value::String(v));
            }
        };
        put("$geoip_city_name", city.city.and_then(|c| name(c.names)));
        put(
            "$geoip_country_name",
            city.country.as_ref().and_then(|c| name(c.names.clone())),
        );
        put(
            "$geoip_country_code",
            city.country.and_then(|c| c.iso_code.map(str::to_string)),
        );
        put(
            "$geoip_continent_name",
            city.continent.as_ref().and_then(|c| name(c.names.clone())),
        );
        put(
            "$geoip_continent_code",
            city.continent.and_then(|c| c.code.map(str::to_string)),
        );
        put(
            "$geoip_postal_code",
            city.postal.and_then(|p| p.code.map(str::to_string)),
        );
        put(
            "$geoip_time_zone",
            city.location.and_then(|l| l.time_zone.map(str::to_string)),
        );
        out
    }

    /// Fills the `$geoip_*` gaps of `person_properties` (values sent by the client win; nulls
    /// are replaced).
    pub fn enrich(&self, ip: IpAddr, person_properties: &mut Map<String, Value>) {
        for (key, value) in self.properties(ip) {
            match person_properties.get(&key) {
                Some(existing) if !existing.is_null() => {}
                _ => {
                    person_properties.insert(key, value);
                }
            }
        }
    }
}
