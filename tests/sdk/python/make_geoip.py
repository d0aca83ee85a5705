"""Writes a tiny MaxMind-format city database for the GeoIP tests.

Usage: make_geoip.py OUT_PATH — 203.0.113.0/24 is Paris, France; 198.51.100.0/24 is Austin, US.
"""
import sys

import netaddr
from mmdb_writer import MMDBWriter

writer = MMDBWriter(ip_version=4, database_type="GeoLite2-City", languages=["en"], description="Corvid test")
writer.insert_network(netaddr.IPSet(["203.0.113.0/24"]), {
    "city": {"names": {"en": "Paris"}},
    "country": {"iso_code": "FR", "names": {"en": "France"}},
    "continent": {"code": "EU", "names": {"en": "Europe"}},
    "postal": {"code": "75001"},
    "location": {"time_zone": "Europe/Paris"},
})
writer.insert_network(netaddr.IPSet(["198.51.100.0/24"]), {
    "city": {"names": {"en": "Austin"}},
    "country": {"iso_code": "US", "names": {"en": "United States"}},
    "continent": {"code": "NA", "names": {"en": "North America"}},
    "postal": {"code": "78701"},
    "location": {"time_zone": "America/Chicago"},
})
writer.to_db_file(sys.argv[1])
print("ok")
