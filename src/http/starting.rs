//! What a cluster node's port answers while the node waits for its metastore: `/_health` 200
//! (the process is alive), everything else 503 with `{"status": "starting"}`, so load
//! balancers and orchestrators hold traffic until the real server takes the port over.

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::json;

/// Serves the starting answers on a clone of `listener` (the real server listens on the
/// original once this one is stopped).
pub fn serve(listener: &std::net::TcpListener) -> std::io::Result<ServerHandle> {
    let server = HttpServer::new(|| {
        App::new()
            .route(
                "/_health",
                web::get().to(|| async { HttpResponse::Ok().json(json!({"status": "ok"})) }),
            )
            .default_service(web::to(|| async {
                HttpResponse::ServiceUnavailable().json(json!({"status": "starting"}))
            }))
    })
    .disable_signals()
    .workers(1)
    .shutdown_timeout(1)
    .listen(listener.try_clone()?)?
    .run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    Ok(handle)
}
