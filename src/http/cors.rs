//! CORS for the public routes browsers call (capture, `/flags`, `/decide`, remote config,
//! public surveys and early-access features, SDK scripts), as PostHog serves them: the Origin
//! is echoed with credentials allowed, every header the browser asks for is allowed (the SDK's
//! `Content-Type` and whatever a site adds with `request_headers`), and preflights are answered.
//! Applied to every answer of those routes, errors included, so a browser can read a 4xx body.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpResponse;

/// Headers allowed when a preflight does not list any.
const DEFAULT_ALLOWED_HEADERS: &str = "Content-Type, Content-Encoding, X-Requested-With";

/// The middleware (wrap a resource with `from_fn(cors::public)`).
pub async fn public(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let asked = req
        .headers()
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned();
    let mut res = next.call(req).await?;
    let headers = res.headers_mut();
    match origin.filter(|o| o.as_bytes() != b"null") {
        Some(origin) => {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        None => {
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
        }
    }
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS, HEAD"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        asked.unwrap_or(HeaderValue::from_static(DEFAULT_ALLOWED_HEADERS)),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    Ok(res)
}

/// A preflight answer: empty, 204; the middleware adds the CORS headers.
pub async fn preflight() -> HttpResponse {
    HttpResponse::NoContent()
        .insert_header((header::ALLOW, "GET, POST, OPTIONS, HEAD"))
        .finish()
}

#[cfg(test)]
mod tests {
    use actix_web::middleware::from_fn;
    use actix_web::{test, web, App};

    use super::*;

    #[actix_web::test]
    async fn echoes_the_origin_and_the_asked_headers_on_every_answer() {
        let app = test::init_service(
            App::new().service(
                web::resource("/p")
                    .wrap(from_fn(public))
                    .route(web::post().to(|| async { HttpResponse::BadRequest().finish() }))
                    .route(web::method(actix_web::http::Method::OPTIONS).to(preflight)),
            ),
        )
        .await;
        let req = test::TestRequest::default()
            .method(actix_web::http::Method::OPTIONS)
            .uri("/p")
            .insert_header(("Origin", "http://site.test:8080"))
            .insert_header(("Access-Control-Request-Headers", "content-type,x-custom"))
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), 204);
        let h = res.headers();
        assert_eq!(
            h.get("access-control-allow-origin")
                .expect("access-control-allow-origin"),
            "http://site.test:8080"
        );
        assert_eq!(
            h.get("access-control-allow-credentials")
                .expect("access-control-allow-credentials"),
            "true"
        );
        assert_eq!(
            h.get("access-control-allow-headers")
                .expect("access-control-allow-headers"),
            "content-type,x-custom"
        );
        assert!(h
            .get("access-control-allow-methods")
            .expect("access-control-allow-methods")
            .to_str()
            .is_ok_and(|m| m.contains("POST")));

        let req = test::TestRequest::post()
            .uri("/p")
            .insert_header(("Origin", "https://app.example"))
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), 400, "errors carry CORS headers too");
        assert_eq!(
            res.headers()
                .get("access-control-allow-origin")
                .expect("access-control-allow-origin"),
            "https://app.example"
        );

        let res = test::call_service(&app, test::TestRequest::post().uri("/p").to_request()).await;
        assert_eq!(
            res.headers()
                .get("access-control-allow-origin")
                .expect("access-control-allow-origin"),
            "*"
        );
        assert!(!res
            .headers()
            .contains_key("access-control-allow-credentials"));
    }
}
