//! RFC 8414 authorization-server metadata and RFC 9728 protected-resource metadata. Both are
//! built from `public_url` alone, so every host this server answers on (US, EU,
//! region-agnostic) serves the same documents.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use corvid_oauth::supported_scopes;
use serde_json::json;

use crate::state::AppState;

fn document(body: serde_json::Value) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"))
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .json(body)
}

pub async fn authorization_server(state: web::Data<AppState>) -> HttpResponse {
    let b = &state.public_url;
    document(json!({
        "issuer": b.as_ref(),
        "authorization_endpoint": format!("{b}/oauth/authorize/"),
        "token_endpoint": format!("{b}/oauth/token/"),
        "revocation_endpoint": format!("{b}/oauth/revoke/"),
        "introspection_endpoint": format!("{b}/oauth/introspect/"),
        "scopes_supported": supported_scopes(),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "introspection_endpoint_auth_methods_supported": ["bearer"],
        "client_id_metadata_document_supported": true,
        "authorization_response_iss_parameter_supported": true,
    }))
}

/// `/.well-known/oauth-protected-resource{/path}`: the resource is the base URL plus the path
/// suffix (RFC 9728 §3.3: it must equal the identifier the well-known URL was built from).
pub async fn protected_resource(
    state: web::Data<AppState>,
    tail: Option<web::Path<String>>,
) -> HttpResponse {
    let b = &state.public_url;
    let resource = match tail.map(|t| t.into_inner()).filter(|t| !t.is_empty()) {
        Some(t) => format!("{b}/{}", t.trim_start_matches('/')),
        None => b.to_string(),
    };
    document(json!({
        "resource": resource,
        "authorization_servers": [b.as_ref()],
        "scopes_supported": supported_scopes(),
        "bearer_methods_supported": ["header"],
        "resource_name": "Corvid",
    }))
}
