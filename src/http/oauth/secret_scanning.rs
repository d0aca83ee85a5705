//! `POST /api/secret-scanning/github`: token reports from a public code host's secret scanner.
//!
//! The body is a JSON list of `{token, type, url, source}` signed (ECDSA P-256, SHA-256) by
//! one of the configured keys: `Github-Public-Key-Identifier` names it and
//! `Github-Public-Key-Signature` carries the base64 DER signature. Every reported `pha_`,
//! `phr_` or `phx_` token is revoked; the answer says per token whether it was live
//! (`true_positive`) or not (`false_positive`), in the reporter's response format.

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use corvid_oauth::verify_report_signature;
use corvid_oauth::Report;
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
    if !verify_report_signature(&state.secret_scanning_keys, &key_id, &signature, &body) {
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
    let outcomes = state.engine.oauth.report_leaks(reports, Utc::now()).await?;
    let answer: Vec<_> = outcomes
        .into_iter()
        .map(|o| {
            json!({
                "token_raw": o.report.token,
                "token_type": o.report.token_type,
                "label": if o.was_active { "true_positive" } else { "false_positive" },
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(answer))
}
