//! Who may learn what about a token (RFC 7662 introspection), and what happens to tokens a
//! secret scanner found in public (every reported Corvid credential is revoked at once).

use chrono::{DateTime, Utc};

use super::records::TokenKind;
use super::secret_scanning::Report;
use super::{OAuth, ACCESS_TOKEN_PREFIX, REFRESH_TOKEN_PREFIX};
use corvid_kernel::secrets::{sha256_hex, PERSONAL_API_KEY_PREFIX};
use corvid_kernel::StoreError;

/// What introspection may tell about a token.
#[derive(Debug, Clone, PartialEq)]
pub enum Introspection {
    /// Unknown, expired, revoked, or not the caller's to see: all look alike.
    Inactive,
    Active {
        kind: TokenKind,
        scopes: Vec<String>,
        client_id: String,
        expires_at: DateTime<Utc>,
        issued_at: DateTime<Utc>,
        /// The user's UUID and email (absent when the user is gone).
        subject: Option<(uuid::Uuid, String)>,
        /// The resource the grant is bound to.
        audience: Option<String>,
    },
}

/// One reported token and whether it was live when revoked.
#[derive(Debug, Clone)]
pub struct LeakOutcome {
    pub report: Report,
    pub was_active: bool,
}

impl OAuth {
    /// RFC 7662. `caller` is the bearer credential of the request: an OAuth access token sees
    /// tokens of its own client (itself included); a staff user's personal API key sees any.
    /// `None` when the caller may not introspect at all.
    pub async fn introspect(
        &self,
        caller: Option<&str>,
        token: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Introspection>, StoreError> {
        // Some(client) = sees only that client's tokens; None = sees every token.
        let only_client: Option<String> = match caller {
            Some(c) if c.starts_with(ACCESS_TOKEN_PREFIX) => {
                let lookup = sha256_hex(c);
                match self.grants(move |g| g.token(&lookup)).await? {
                    Some(s) if s.token.kind == TokenKind::Access && s.is_active(now) => {
                        Some(s.token.client_id)
                    }
                    _ => return Ok(None),
                }
            }
            Some(c) if c.starts_with(PERSONAL_API_KEY_PREFIX) => {
                match self.inner.tenancy.authenticate_key(c).await? {
                    Some(credential) if credential.user.is_staff => None,
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let lookup = sha256_hex(token);
        let Some(state) = self.grants(move |g| g.token(&lookup)).await? else {
            return Ok(Some(Introspection::Inactive));
        };
        let visible = only_client.is_none_or(|c| c == state.token.client_id);
        if !visible || !state.is_active(now) {
            return Ok(Some(Introspection::Inactive));
        }
        let user = self.inner.tenancy.user(state.token.user_id).await?;
        let t = state.token;
        Ok(Some(Introspection::Active {
            kind: t.kind,
            scopes: t.scopes,
            client_id: t.client_id,
            expires_at: t.expires_at,
            issued_at: t.issued_at,
            subject: user.map(|u| (u.uuid, u.email)),
            audience: t.resource,
        }))
    }

    /// Revokes every reported `pha_`, `phr_` or `phx_` token (a refresh token takes its grant
    /// with it; a personal API key is deleted) and says which were live.
    pub async fn report_leaks(
        &self,
        reports: Vec<Report>,
        now: DateTime<Utc>,
    ) -> Result<Vec<LeakOutcome>, StoreError> {
        let mut out = Vec::with_capacity(reports.len());
        for report in reports {
            let token = report.token.trim();
            let was_active = if token.starts_with(ACCESS_TOKEN_PREFIX)
                || token.starts_with(REFRESH_TOKEN_PREFIX)
            {
                self.revoke(token, None, now).await?
            } else if token.starts_with(PERSONAL_API_KEY_PREFIX) {
                self.inner.tenancy.revoke_leaked_key(token).await?
            } else {
                false
            };
            if was_active {
                tracing::warn!(token_type = %report.token_type, url = ?report.url, source = ?report.source, "leaked token revoked by secret scanning");
            }
            out.push(LeakOutcome { report, was_active });
        }
        Ok(out)
    }
}
