//! First-run credentials: created once, printed once, saved to `<data-dir>/credentials.json`.

use std::io::Write;
use std::path::Path;

use corvid_tenancy::Bootstrapped;
use serde::Serialize;

/// What `corvid bootstrap --json` prints and `credentials.json` holds.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Credentials {
    pub project_id: u64,
    pub project_token: String,
    pub personal_api_key: String,
    pub email: String,
    /// Only when the admin user was created by this call.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub password: Option<String>,
}

/// The credentials to show and save, when the bootstrap minted a key.
pub fn credentials(outcome: Bootstrapped) -> Option<Credentials> {
    Some(Credentials {
        project_id: outcome.project.id,
        project_token: outcome.project.api_token,
        personal_api_key: outcome.personal_api_key?,
        email: outcome.admin.email,
        password: outcome.admin_password,
    })
}

/// Writes the credentials file with mode 0600, atomically (temp file, fsync, rename).
pub fn write_credentials(path: &Path, credentials: &Credentials) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp)?;
    let json = serde_json::to_vec_pretty(credentials).map_err(std::io::Error::other)?;
    file.write_all(&json)?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The human-readable first-run banner.
pub fn banner(credentials: &Credentials, saved_to: &Path) -> String {
    let password = credentials
        .password
        .as_deref()
        .unwrap_or("(unchanged; not shown again)");
    format!(
        "\n\
         ================================ Corvid ================================\n\
         \x20 Project id:        {}\n\
         \x20 Project token:     {}   (for SDKs: api_key / token)\n\
         \x20 Personal API key:  {}   (all scopes; Authorization: Bearer …)\n\
         \x20 Admin login:       {} / {}\n\
         \x20 Saved to {} (mode 0600). They are not printed again.\n\
         =========================================================================\n",
        credentials.project_id,
        credentials.project_token,
        credentials.personal_api_key,
        credentials.email,
        password,
        saved_to.display()
    )
}
