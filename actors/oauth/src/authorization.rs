//! The authorization request's rules (RFC 6749 §4.1.1, RFC 7636, RFC 8707, RFC 9700 §4.11.2).
//!
//! Two stages, because their errors travel differently: the client and its redirect URI are
//! settled first ([`OAuth::authorization_client`]), and a problem with either is shown to the
//! user, never redirected; everything else ([`OAuth::check_authorization`]) is answered by an
//! error redirect to the validated redirect URI.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::cimd::Client;
use super::{pkce, redirect, scopes, OAuth};

/// Why a request cannot even be answered by redirect: a page with this title and detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientProblem {
    pub title: &'static str,
    pub detail: String,
    /// Nothing is wrong with the request: the server is busy fetching other clients.
    pub retry_later: bool,
}

/// An RFC 6749 §4.1.2.1 error, sent back to the client's redirect URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthorizationProblem {
    pub error: &'static str,
    pub description: &'static str,
}

/// What a valid authorization request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    pub scopes: Vec<String>,
    pub code_challenge: String,
    pub resource: Option<String>,
}

fn problem(error: &'static str, description: &'static str) -> AuthorizationProblem {
    AuthorizationProblem { error, description }
}

/// The parameters of an authorization request (RFC 6749 §4.1.1, PKCE, RFC 8707's `resource`),
/// as the client sent them; the rules below judge them.
#[derive(Debug, Clone, Default)]
pub struct AuthorizationRequest {
    pub client_id: Option<String>,
    pub redirect_uri: Option<String>,
    pub response_type: Option<String>,
    pub code_challenge: Option<String>,
    pub code_challenge_method: Option<String>,
    pub resource: Option<String>,
    pub scope: Option<String>,
    pub prompt: Option<String>,
}

impl AuthorizationRequest {
    /// The request a query string's or form's parameters make.
    pub fn from_params(p: &HashMap<String, String>) -> AuthorizationRequest {
        let get = |k: &str| p.get(k).cloned();
        AuthorizationRequest {
            client_id: get("client_id"),
            redirect_uri: get("redirect_uri"),
            response_type: get("response_type"),
            code_challenge: get("code_challenge"),
            code_challenge_method: get("code_challenge_method"),
            resource: get("resource"),
            scope: get("scope"),
            prompt: get("prompt"),
        }
    }
}

impl OAuth {
    /// The requesting client and the redirect URI it registered.
    pub async fn authorization_client(
        &self,
        params: &AuthorizationRequest,
        now: DateTime<Utc>,
    ) -> Result<(Arc<Client>, String), ClientProblem> {
        let Some(client_id) = params.client_id.as_ref().filter(|c| !c.is_empty()) else {
            return Err(ClientProblem {
                title: "Invalid request",
                detail: "The request has no client_id.".into(),
                retry_later: false,
            });
        };
        let client = self.client(client_id, now).await.map_err(|err| {
            tracing::info!(%client_id, error = %err, "authorization request from an unusable client");
            let retry_later = matches!(err, super::ClientError::Busy);
            ClientProblem {
                title: if retry_later {
                    "Busy"
                } else {
                    "Unknown application"
                },
                detail: err.to_string(),
                retry_later,
            }
        })?;
        let Some(redirect_uri) = params.redirect_uri.as_ref().filter(|r| !r.is_empty()) else {
            return Err(ClientProblem {
                title: "Invalid request",
                detail: "The request has no redirect_uri.".into(),
                retry_later: false,
            });
        };
        if !redirect::matches(&client.metadata.redirect_uris, redirect_uri) {
            return Err(ClientProblem {
                title: "Invalid redirect",
                detail: "The redirect_uri is not one this application registered in its metadata document.".into(),
                retry_later: false,
            });
        }
        Ok((client, redirect_uri.clone()))
    }

    /// The response type, PKCE, resource and `prompt` rules, and the scopes granted (never
    /// beyond the client's ceiling).
    pub fn check_authorization(
        &self,
        params: &AuthorizationRequest,
        client: &Client,
    ) -> Result<Authorized, AuthorizationProblem> {
        if params.response_type.as_deref() != Some("code") {
            return Err(problem(
                "unsupported_response_type",
                "response_type must be code",
            ));
        }
        let Some(challenge) = params.code_challenge.as_ref().filter(|c| !c.is_empty()) else {
            return Err(problem(
                "invalid_request",
                "code_challenge is required (PKCE with S256)",
            ));
        };
        if params.code_challenge_method.as_deref() != Some("S256") {
            return Err(problem(
                "invalid_request",
                "code_challenge_method must be S256",
            ));
        }
        if !pkce::challenge_well_formed(challenge) {
            return Err(problem(
                "invalid_request",
                "code_challenge must be 43 base64url characters",
            ));
        }
        let resource = params.resource.clone().filter(|r| !r.is_empty());
        if resource
            .as_deref()
            .is_some_and(|r| !self.is_our_resource(r))
        {
            return Err(problem(
                "invalid_target",
                "resource is not served by this server",
            ));
        }
        if params.prompt.as_deref() == Some("none") {
            return Err(problem(
                "consent_required",
                "this server always asks for consent",
            ));
        }
        Ok(Authorized {
            scopes: scopes::grant(
                params.scope.as_deref(),
                client.metadata.scope_ceiling.as_deref(),
            ),
            code_challenge: challenge.clone(),
            resource,
        })
    }

    /// Whether `resource` (RFC 8707) names something this server serves: one of its base URLs
    /// or a path under one. Tokens are only ever issued for such resources.
    pub fn is_our_resource(&self, resource: &str) -> bool {
        is_under(&self.inner.resources, resource)
    }
}

fn is_under(bases: &[url::Url], resource: &str) -> bool {
    let Ok(url) = url::Url::parse(resource) else {
        return false;
    };
    if url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        return false;
    }
    let wanted = url.as_str().trim_end_matches('/');
    bases.iter().any(|base| {
        let base = base.as_str().trim_end_matches('/');
        wanted == base
            || wanted
                .strip_prefix(base)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_our_urls_or_paths_under_them() {
        let bases = vec![
            url::Url::parse("http://127.0.0.1:8000").expect("url"),
            url::Url::parse("https://eu.example.com/").expect("url"),
        ];
        assert!(is_under(&bases, "http://127.0.0.1:8000"));
        assert!(is_under(&bases, "http://127.0.0.1:8000/api/projects"));
        assert!(is_under(&bases, "https://eu.example.com"));
        assert!(!is_under(&bases, "http://127.0.0.1:80001"));
        assert!(!is_under(&bases, "http://127.0.0.1:8000#frag"));
        assert!(!is_under(&bases, "http://user@127.0.0.1:8000"));
        assert!(!is_under(&bases, "https://evil.example.com"));
        assert!(!is_under(&bases, "not a url"));
    }
}
