//! The console's stylesheet and script, compiled into the binary and served under names that
//! carry a hash of their content, so browsers may keep them forever (`immutable`).

use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::{web, HttpResponse};

const CSS: &str = include_str!("static/console.css");
const JS: &str = include_str!("static/console.js");

/// 64-bit FNV-1a of the content, in hex: a stable name per content.
fn fingerprint(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

static CSS_NAME: LazyLock<String> = LazyLock::new(|| format!("console.{}.css", fingerprint(CSS)));
static JS_NAME: LazyLock<String> = LazyLock::new(|| format!("console.{}.js", fingerprint(JS)));

/// The stylesheet's URL.
pub fn css() -> String {
    format!("/console/assets/{}", *CSS_NAME)
}

/// The script's URL.
pub fn js() -> String {
    format!("/console/assets/{}", *JS_NAME)
}

pub async fn serve(name: web::Path<String>) -> HttpResponse {
    let (body, kind) = if *name == *CSS_NAME {
        (CSS, "text/css; charset=utf-8")
    } else if *name == *JS_NAME {
        (JS, "text/javascript; charset=utf-8")
    } else {
        return HttpResponse::NotFound().finish();
    };
    HttpResponse::Ok()
        .content_type(kind)
        .insert_header((header::CACHE_CONTROL, "public, max-age=31536000, immutable"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(body)
}
