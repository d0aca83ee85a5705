//! Answers that stay JSON whatever goes wrong: a handler that panics gets a JSON 500 with a
//! request id (never a dropped connection), and the framework's own errors (an extractor that
//! cannot read the body, form, query or path; a method a resource does not allow) get the
//! same `{"type", "code", "detail", "attr"}` body as every other error.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use futures_util::FutureExt;

use crate::error::ApiError;

/// Middleware: a panic while handling the request becomes a logged JSON 500 naming a request
/// id, so the client is answered (SDKs retry a dropped connection forever) and the operator
/// can find the log line. The answer is returned as an error, which actix renders through
/// [`ApiError`]'s `ResponseError` (the request itself went into the panicking handler).
pub async fn catch_panics<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<B>, actix_web::Error> {
    let (method, path) = (req.method().clone(), req.path().to_string());
    match std::panic::AssertUnwindSafe(next.call(req))
        .catch_unwind()
        .await
    {
        Ok(answer) => answer,
        Err(panic) => {
            let request_id = uuid::Uuid::new_v4();
            tracing::error!(
                %request_id,
                %method,
                path,
                panic = %corvid_kernel::panic_message(&*panic),
                "request handler panicked"
            );
            Err(ApiError::Panicked { request_id }.into())
        }
    }
}

/// Middleware: an error answer the framework wrote itself (plain text or no body) is rewritten
/// as the JSON error body. Answers already in JSON, and the HTML pages of the sign-in and
/// consent screens, pass untouched. (The request is never cloned before it is routed: the
/// router needs it unshared.)
pub async fn json_errors(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let res = match next.call(req).await {
        Ok(res) => res,
        Err(err) if err.as_error::<ApiError>().is_some() => return Err(err),
        Err(err) => {
            let response = err.error_response();
            let status = response.status();
            let text = match response.into_body().try_into_bytes() {
                Ok(bytes) if status.is_client_error() => {
                    String::from_utf8_lossy(&bytes).into_owned()
                }
                _ => String::new(),
            };
            let detail = framework_detail(status, &text);
            return Err(ApiError::Framework { status, detail }.into());
        }
    };
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) || already_shaped(&res) {
        return Ok(res.map_into_left_body());
    }
    let (request, response) = res.into_parts();
    Ok(reshape(request, response.map_into_boxed_body()).map_into_right_body())
}

/// The framework's error answer, as the JSON error body (its headers kept).
fn reshape(request: HttpRequest, response: HttpResponse) -> ServiceResponse {
    let status = response.status();
    if already_json(response.headers()) {
        return ServiceResponse::new(request, response);
    }
    let kept: Vec<_> = response
        .headers()
        .iter()
        .filter(|(name, _)| **name != header::CONTENT_TYPE && **name != header::CONTENT_LENGTH)
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let text = match response.into_body().try_into_bytes() {
        Ok(bytes) if status.is_client_error() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => String::new(),
    };
    let detail = framework_detail(status, &text);
    let mut rewritten = ApiError::Framework { status, detail }.error_response();
    for (name, value) in kept {
        rewritten.headers_mut().append(name, value);
    }
    ServiceResponse::new(request, rewritten)
}

fn already_json(headers: &header::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json") || ct.starts_with("text/html"))
}

fn already_shaped<B>(res: &ServiceResponse<B>) -> bool {
    already_json(res.headers())
}

/// Error handlers of the framework's extractors, so a bad JSON body, form, query string or
/// path segment is a 400 (or 413) in the JSON error shape on every route family.
pub fn extractor_errors(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::JsonConfig::default().error_handler(|err, _| extractor(err.to_string())))
        .app_data(
            web::FormConfig::default().error_handler(|err, _| match err {
                actix_web::error::UrlencodedError::Overflow { limit, .. } => {
                    ApiError::PayloadTooLarge { limit }.into()
                }
                other => extractor(format!("Malformed form body: {other}")),
            }),
        )
        .app_data(
            web::QueryConfig::default()
                .error_handler(|err, _| extractor(format!("Malformed query string: {err}"))),
        )
        .app_data(
            web::PathConfig::default().error_handler(|err, _: &HttpRequest| {
                ApiError::not_found(format!("Resource ({err})")).into()
            }),
        );
}

fn extractor(detail: String) -> actix_web::Error {
    ApiError::validation(detail, None).into()
}

/// The framework's error text, or nothing (its body may be empty).
pub fn framework_detail(status: actix_web::http::StatusCode, text: &str) -> String {
    let text = text.trim();
    if !text.is_empty() && text.len() <= 300 {
        return text.to_string();
    }
    status
        .canonical_reason()
        .unwrap_or("The request could not be handled.")
        .to_string()
}

#[cfg(test)]
mod tests {
    use actix_web::middleware::from_fn;
    use actix_web::{test, web, App, HttpResponse};

    use super::*;

    #[actix_web::test]
    async fn a_panicking_handler_answers_json_500_with_a_request_id() {
        let app = test::init_service(
            App::new()
                .wrap(from_fn(catch_panics))
                .wrap(from_fn(json_errors))
                .route(
                    "/boom",
                    web::get().to(|| async {
                        if std::hint::black_box(true) {
                            panic!("a handler bug");
                        }
                        HttpResponse::Ok().finish()
                    }),
                )
                .service(web::resource("/only-get").route(web::get().to(HttpResponse::Ok))),
        )
        .await;
        // The panic comes back as an error, which actix renders (as the server does).
        let err = test::try_call_service(&app, test::TestRequest::get().uri("/boom").to_request())
            .await
            .expect_err("the panic becomes an error");
        let res = err.error_response();
        assert_eq!(res.status(), 500);
        let bytes = actix_web::body::to_bytes(res.into_body())
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(body["code"], "internal_error");
        assert!(
            body["request_id"].as_str().is_some_and(|id| id.len() == 36),
            "{body}"
        );

        // The framework's own 405 comes back in the JSON error shape.
        let res = test::call_service(
            &app,
            test::TestRequest::post().uri("/only-get").to_request(),
        )
        .await;
        assert_eq!(res.status(), 405);
        let body: serde_json::Value = test::read_body_json(res).await;
        assert_eq!(body["code"], "method_not_allowed");
        assert!(body.get("detail").is_some() && body.get("attr").is_some());
    }
}
