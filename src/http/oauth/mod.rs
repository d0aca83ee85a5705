//! The OAuth 2.0 authorization server's HTTP surface: discovery documents, sign-in, consent,
//! token / revoke / introspect, the verified-clients admin API and secret scanning. The rules
//! live in `corvid_oauth`; these handlers parse, render and map errors.

mod admin;
mod authorize;
mod login;
mod metadata;
pub(crate) mod pages;
mod secret_scanning;
pub(crate) mod session;
mod token;

use actix_web::web;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/.well-known/oauth-authorization-server",
        web::get().to(metadata::authorization_server),
    )
    .route(
        "/.well-known/oauth-authorization-server/{tail:.*}",
        web::get().to(metadata::authorization_server),
    )
    .route(
        "/.well-known/oauth-protected-resource",
        web::get().to(metadata::protected_resource),
    )
    .route(
        "/.well-known/oauth-protected-resource/{tail:.*}",
        web::get().to(metadata::protected_resource),
    )
    .route("/login", web::get().to(login::form))
    .route("/login", web::post().to(login::submit))
    .route("/logout", web::post().to(login::logout))
    .route("/oauth/authorize", web::get().to(authorize::show))
    .route("/oauth/authorize", web::post().to(authorize::decide))
    .route("/oauth/logo/{key}", web::get().to(authorize::logo))
    .route("/oauth/token", web::post().to(token::token))
    .route("/oauth/revoke", web::post().to(token::revoke))
    .route("/oauth/introspect", web::post().to(token::introspect))
    .route("/api/oauth/verified_clients", web::get().to(admin::list))
    .route("/api/oauth/verified_clients", web::post().to(admin::verify))
    .route(
        "/api/oauth/verified_clients",
        web::delete().to(admin::unverify),
    )
    .route(
        "/api/secret-scanning/github",
        web::post().to(secret_scanning::report),
    );
}
