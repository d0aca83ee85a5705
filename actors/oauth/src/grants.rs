//! Grants: codes become tokens once, refresh tokens rotate once, and a replay of either
//! revokes everything its grant issued (RFC 6749 §4.1.2, §10.4; RFC 9700 §4.14).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::records::{CodeRecord, FamilyRecord, Redeemed, TokenKind, TokenRecord};
use super::{
    chrono_duration, pkce, scopes, OAuth, OAuthError, ACCESS_TOKEN_PREFIX, REFRESH_TOKEN_PREFIX,
};
use corvid_kernel::blocking;
use corvid_kernel::secrets::{random_base62, sha256_hex};
use corvid_kernel::StoreError;

const CODE_INVALID: &str = "Authorization code is invalid or has already been used";
const REFRESH_INVALID: &str = "Refresh token is invalid, expired or revoked";

/// A freshly issued token pair.
#[derive(Debug, Clone)]
pub struct Issued {
    pub access_token: String,
    pub refresh_token: String,
    pub expires_in: u64,
    pub scopes: Vec<String>,
}

/// What a consented authorization request carries into its code.
#[derive(Debug, Clone)]
pub struct Approval {
    pub user_id: u64,
    pub client_id: String,
    pub redirect_uri: String,
    pub scopes: Vec<String>,
    pub code_challenge: String,
    pub resource: Option<String>,
}

/// A token-endpoint `authorization_code` request.
#[derive(Debug, Clone, Default)]
pub struct CodeExchange {
    pub code: String,
    pub client_id: Option<String>,
    pub redirect_uri: Option<String>,
    pub code_verifier: Option<String>,
    pub resource: Option<String>,
}

/// A token-endpoint `refresh_token` request.
#[derive(Debug, Clone, Default)]
pub struct RefreshRequest {
    pub refresh_token: String,
    pub client_id: Option<String>,
    pub scope: Option<String>,
    pub resource: Option<String>,
}

/// A token-endpoint request.
#[derive(Debug, Clone)]
pub enum TokenRequest {
    AuthorizationCode(CodeExchange),
    RefreshToken(RefreshRequest),
}

impl TokenRequest {
    /// The resource (RFC 8707) the token is asked for, if any.
    pub fn resource(&self) -> Option<&str> {
        match self {
            TokenRequest::AuthorizationCode(c) => c.resource.as_deref(),
            TokenRequest::RefreshToken(r) => r.resource.as_deref(),
        }
    }

    /// The request its parameters make (empty values count as absent).
    pub fn from_params(p: &HashMap<String, String>) -> Result<TokenRequest, OAuthError> {
        let get = |k: &str| p.get(k).filter(|v| !v.is_empty()).cloned();
        match p.get("grant_type").map(String::as_str) {
            Some("authorization_code") => Ok(TokenRequest::AuthorizationCode(CodeExchange {
                code: get("code").unwrap_or_default(),
                client_id: get("client_id"),
                redirect_uri: get("redirect_uri"),
                code_verifier: get("code_verifier"),
                resource: get("resource"),
            })),
            Some("refresh_token") => Ok(TokenRequest::RefreshToken(RefreshRequest {
                refresh_token: get("refresh_token").unwrap_or_default(),
                client_id: get("client_id"),
                scope: get("scope"),
                resource: get("resource"),
            })),
            None => Err(OAuthError::InvalidRequest("grant_type is required".into())),
            Some(_) => Err(OAuthError::UnsupportedGrantType),
        }
    }
}

impl OAuth {
    /// Issues a one-time authorization code for a consented request (only its hash is kept).
    pub async fn create_code(
        &self,
        approval: Approval,
        now: DateTime<Utc>,
    ) -> Result<String, StoreError> {
        let code = random_base62(43);
        let record = CodeRecord {
            user_id: approval.user_id,
            client_id: approval.client_id,
            redirect_uri: approval.redirect_uri,
            scopes: approval.scopes,
            code_challenge: approval.code_challenge,
            resource: approval.resource,
            expires_at: now + chrono_duration(self.inner.lifetimes.code),
            used: false,
            family_id: Uuid::new_v4(),
        };
        let hash = sha256_hex(&code);
        self.grants(move |g| g.put_code(&hash, &record)).await?;
        Ok(code)
    }

    /// The token endpoint: the resource is checked first (RFC 8707), then the grant.
    pub async fn token(
        &self,
        request: TokenRequest,
        now: DateTime<Utc>,
    ) -> Result<Issued, OAuthError> {
        if let Some(resource) = request.resource() {
            if !self.is_our_resource(resource) {
                return Err(OAuthError::InvalidTarget(
                    "resource is not served by this server".into(),
                ));
            }
        }
        let me = self.clone();
        blocking(move || match request {
            TokenRequest::AuthorizationCode(exchange) => me.exchange_code(exchange, now),
            TokenRequest::RefreshToken(refresh) => me.refresh(refresh, now),
        })
        .await
    }

    /// `grant_type=authorization_code`. The code is burned before anything else is checked,
    /// so a failed attempt cannot be retried; a replay revokes what the code issued.
    fn exchange_code(&self, req: CodeExchange, now: DateTime<Utc>) -> Result<Issued, OAuthError> {
        if req.code.is_empty() {
            return Err(OAuthError::InvalidRequest("code is required".into()));
        }
        let code = match self.inner.grants.redeem_code(&sha256_hex(&req.code))? {
            Redeemed::Fresh(code) => code,
            Redeemed::Missing => return Err(OAuthError::InvalidGrant(CODE_INVALID.into())),
            Redeemed::Replayed(code) if proves_possession(&code, &req) => {
                // The client that started the flow, retrying or racing its own request (it
                // holds the PKCE verifier): refused, but its grant stands, so of concurrent
                // redemptions exactly one gets working tokens.
                tracing::info!(client_id = %code.client_id, "authorization code presented again by its client");
                return Err(OAuthError::InvalidGrant(CODE_INVALID.into()));
            }
            Redeemed::Replayed(code) => {
                tracing::warn!(client_id = %code.client_id, "authorization code replayed; revoking its grant");
                self.revoke_family(code.family_id, code.user_id, &code.client_id, now)?;
                return Err(OAuthError::InvalidGrant(CODE_INVALID.into()));
            }
        };
        check_exchange(&code, &req, now)?;
        let family = FamilyRecord::new(code.user_id, &code.client_id, now);
        match self.issue_pair(code.family_id, &family, code.scopes, code.resource, now) {
            Err(StoreError::Conflict { .. }) => Err(OAuthError::InvalidGrant(CODE_INVALID.into())),
            issued => Ok(issued?),
        }
    }

    /// `grant_type=refresh_token` with rotation: the presented token is used up; presenting it
    /// again revokes its whole grant.
    fn refresh(&self, req: RefreshRequest, now: DateTime<Utc>) -> Result<Issued, OAuthError> {
        let invalid = || OAuthError::InvalidGrant(REFRESH_INVALID.into());
        if req.refresh_token.is_empty() {
            return Err(OAuthError::InvalidRequest(
                "refresh_token is required".into(),
            ));
        }
        let hash = sha256_hex(&req.refresh_token);
        // Check before redeeming, so a wrong client cannot burn someone else's token.
        let Some(state) = self.inner.grants.token(&hash)? else {
            return Err(invalid());
        };
        if state.token.kind != TokenKind::Refresh {
            return Err(invalid());
        }
        if req
            .client_id
            .as_deref()
            .is_some_and(|id| id != state.token.client_id)
        {
            return Err(OAuthError::InvalidGrant(
                "refresh token was issued to another client".into(),
            ));
        }
        if state.family_revoked || state.token.expires_at <= now {
            return Err(invalid());
        }
        let held = state.token.resource.as_deref();
        if req
            .resource
            .as_deref()
            .is_some_and(|r| held.is_some_and(|held| held != r))
        {
            return Err(OAuthError::InvalidTarget(
                "resource differs from the grant's".into(),
            ));
        }
        let scopes =
            scopes::narrow(&state.token.scopes, req.scope.as_deref()).ok_or_else(|| {
                OAuthError::InvalidScope("a refresh can only narrow the granted scopes".into())
            })?;
        let token = match self.inner.grants.redeem_refresh(&hash)? {
            Redeemed::Fresh(token) => token,
            Redeemed::Missing => return Err(invalid()),
            Redeemed::Replayed(token) => {
                tracing::warn!(client_id = %token.client_id, "rotated refresh token reused; revoking its grant");
                self.revoke_family(token.family_id, token.user_id, &token.client_id, now)?;
                return Err(OAuthError::InvalidGrant(
                    "Refresh token has already been used; the grant has been revoked".into(),
                ));
            }
        };
        let family = FamilyRecord::new(token.user_id, &token.client_id, now);
        match self.issue_pair(token.family_id, &family, scopes, token.resource, now) {
            Err(StoreError::Conflict { .. }) => Err(invalid()),
            issued => Ok(issued?),
        }
    }

    /// Revokes a grant durably and remembers it for cached credentials.
    fn revoke_family(
        &self,
        family_id: Uuid,
        user_id: u64,
        client_id: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let template = FamilyRecord::new(user_id, client_id, now);
        self.inner.grants.revoke_family(family_id, &template, now)?;
        self.inner.revoked_families.insert(family_id, now);
        Ok(())
    }

    fn issue_pair(
        &self,
        family_id: Uuid,
        family: &FamilyRecord,
        scopes: Vec<String>,
        resource: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Issued, StoreError> {
        let lifetimes = &self.inner.lifetimes;
        let access = format!("{ACCESS_TOKEN_PREFIX}{}", random_base62(43));
        let refresh = format!("{REFRESH_TOKEN_PREFIX}{}", random_base62(43));
        let record = |kind, ttl| TokenRecord {
            kind,
            family_id,
            user_id: family.user_id,
            client_id: family.client_id.clone(),
            scopes: scopes.clone(),
            resource: resource.clone(),
            issued_at: now,
            expires_at: now + chrono_duration(ttl),
            revoked: false,
        };
        let tokens = vec![
            (
                sha256_hex(&access),
                record(TokenKind::Access, lifetimes.access_token),
            ),
            (
                sha256_hex(&refresh),
                record(TokenKind::Refresh, lifetimes.refresh_token),
            ),
        ];
        self.inner.grants.issue(family_id, family, &tokens)?;
        Ok(Issued {
            access_token: access,
            refresh_token: refresh,
            expires_in: lifetimes.access_token.as_secs(),
            scopes,
        })
    }

    /// RFC 7009: revokes `token` unless it belongs to another client than `client_id`. A
    /// refresh token takes its whole grant with it. Whether it was active.
    pub async fn revoke(
        &self,
        token: &str,
        client_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let hash = sha256_hex(token);
        let (me, lookup, client_id) = (self.clone(), hash.clone(), client_id.map(str::to_string));
        let active =
            blocking(move || me.revoke_blocking(&lookup, client_id.as_deref(), now)).await?;
        self.inner.tenancy.forget_credential(&hash);
        Ok(active)
    }

    pub(super) fn revoke_blocking(
        &self,
        hash: &str,
        client_id: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let Some(state) = self.inner.grants.token(hash)? else {
            return Ok(false);
        };
        if client_id.is_some_and(|id| id != state.token.client_id) {
            return Ok(false);
        }
        let active = state.is_active(now);
        self.inner.grants.revoke_token(hash, now)?;
        if state.token.kind == TokenKind::Refresh {
            let t = &state.token;
            self.revoke_family(t.family_id, t.user_id, &t.client_id, now)?;
        }
        Ok(active)
    }
}

/// Whether a presented code comes from the client it was issued to, holding the PKCE verifier
/// of the authorization request (a replay without it is an attacker's).
fn proves_possession(code: &CodeRecord, req: &CodeExchange) -> bool {
    req.client_id.as_deref() == Some(code.client_id.as_str())
        && req
            .code_verifier
            .as_deref()
            .is_some_and(|v| pkce::verifier_well_formed(v) && pkce::verify(v, &code.code_challenge))
}

fn check_exchange(
    code: &CodeRecord,
    req: &CodeExchange,
    now: DateTime<Utc>,
) -> Result<(), OAuthError> {
    if code.expires_at <= now {
        return Err(OAuthError::InvalidGrant(
            "Authorization code has expired".into(),
        ));
    }
    match req.client_id.as_deref() {
        Some(id) if id == code.client_id => {}
        Some(_) => {
            return Err(OAuthError::InvalidGrant(
                "client_id does not match the authorization request".into(),
            ))
        }
        None => return Err(OAuthError::InvalidRequest("client_id is required".into())),
    }
    if req.redirect_uri.as_deref() != Some(code.redirect_uri.as_str()) {
        return Err(OAuthError::InvalidGrant(
            "redirect_uri does not match the authorization request".into(),
        ));
    }
    let Some(verifier) = req.code_verifier.as_deref() else {
        return Err(OAuthError::InvalidRequest(
            "code_verifier is required (PKCE)".into(),
        ));
    };
    if !pkce::verifier_well_formed(verifier) {
        return Err(OAuthError::InvalidRequest(
            "code_verifier must be 43-128 characters of A-Z a-z 0-9 - . _ ~".into(),
        ));
    }
    if !pkce::verify(verifier, &code.code_challenge) {
        return Err(OAuthError::InvalidGrant("PKCE verification failed".into()));
    }
    if let Some(resource) = &req.resource {
        if code.resource.as_deref().is_some_and(|r| r != resource) {
            return Err(OAuthError::InvalidTarget(
                "resource differs from the one approved at authorization".into(),
            ));
        }
    }
    Ok(())
}
