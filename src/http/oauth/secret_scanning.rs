//! `POST /api/secret-scanning/github`: token reports from a public code host's secret scanner.
//!
//! The body is a JSON list of `{token, type, url, source}` signed (ECDSA P-256, SHA-256) by
//! one of the configured keys: `Github-Public-Key-Identifier` names it and
//! `Github-Public-Key-Signature` carries the base64 DER signature. Every reported `pha_`,
//! `phr_` or `phx_` token is revoked; the answer says per token whether it was live
//! (`true_positive`) or not (`false_positive`), in the reporter's response format.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use corvid_actors::kernel::secrets::{sha256_hex, PERSONAL_API_KEY_PREFIX};
use corvid_actors::oauth::secret_scanning::{self, Report};
use corvid_actors::oauth::{ACCESS_TOKEN_PREFIX, REFRESH_TOKEN_PREFIX};
use serde_json::json;

use crate::error::ApiError;
use crate::state::AppState;

const KEY_ID_HEADER: &str = "Github-Public-Key-Identifier";
const SIGNATURE_HEADER: &str = "Github-Public-Key-Signature";

/// Most tokens one report may carry.
const MAX_REPORTS: usize = 1000;

pub async fn report(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (Some(key_id), Some(signature)) = (header(KEY_ID_HEADER), header(SIGNATURE_HEADER)) else {
        return Err(ApiError::PermissionDenied {
            detail: format!("Missing {KEY_ID_HEADER} or {SIGNATURE_HEADER} header."),
        });
    };
    if !secret_scanning::verify(&state.secret_scanning_keys, &key_id, &signature, &body) {
        tracing::warn!(%key_id, "secret-scanning report with a bad signature");
        return Err(ApiError::PermissionDenied {
            detail: "Signature verification failed.".into(),
        });
    }
    let reports: Vec<Report> = serde_json::from_slice(&body).map_err(|e| {
        ApiError::validation(
            format!("The body must be a JSON list of token reports: {e}"),
            None,
        )
    })?;
    if reports.len() > MAX_REPORTS {
        return Err(ApiError::validation(
            format!("At most {MAX_REPORTS} tokens per report."),
            None,
        ));
    }
    let oauth = Arc::clone(&state.oauth);
    let meta = Arc::clone(&state.meta);
    let outcomes = web::block(
        move || -> Result<Vec<(Report, bool)>, corvid_actors::meta::StoreError> {
            let mut out = Vec::with_capacity(reports.len());
            for r in reports {
                let token = r.token.trim();
                let active = if token.starts_with(ACCESS_TOKEN_PREFIX)
                    || token.starts_with(REFRESH_TOKEN_PREFIX)
                {
                    oauth.revoke(token, None)?.0
                } else if token.starts_with(PERSONAL_API_KEY_PREFIX) {
                    match meta.personal_api_key_by_hash(&sha256_hex(token))? {
                        Some(key) => meta.delete_personal_api_key(&key.id)?.is_some(),
                        None => false,
                    }
                } else {
                    false
                };
                out.push((r, active));
            }
            Ok(out)
        },
    )
    .await??;
    let mut answer = Vec::with_capacity(outcomes.len());
    for (r, active) in outcomes {
        // A revoked refresh token takes its family with it (the engine tells cached
        // credentials); the reported token itself may sit in the credential cache.
        state.cache.forget_credential(&sha256_hex(r.token.trim()));
        if active {
            tracing::warn!(token_type = %r.token_type, url = ?r.url, source = ?r.source, "leaked token revoked by secret scanning");
        }
        answer.push(json!({
            "token_raw": r.token,
            "token_type": r.token_type,
            "label": if active { "true_positive" } else { "false_positive" },
        }));
    }
    Ok(HttpResponse::Ok().json(answer))
}
