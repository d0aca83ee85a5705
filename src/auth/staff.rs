//! [`Staff<S>`]: a bearer credential holding scope `S` whose user is instance staff. The one
//! place the staff rule is applied: routes that administer the instance (internal statistics,
//! organization settings, verified OAuth applications) take this extractor.

use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest};
use corvid_tenancy::Credential;
use futures_util::future::LocalBoxFuture;

use super::scope::RequiredScope;
use super::Authed;
use crate::error::ApiError;

/// A staff user's credential holding scope `S`.
pub struct Staff<S: RequiredScope> {
    pub credential: Arc<Credential>,
    _scope: std::marker::PhantomData<S>,
}

impl<S: RequiredScope + 'static> FromRequest for Staff<S> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let authed = Authed::<S>::from_request(req, payload);
        Box::pin(async move {
            let authed = authed.await?;
            if !authed.credential.user.is_staff {
                return Err(ApiError::PermissionDenied {
                    detail: "Only instance staff may do this.".into(),
                });
            }
            Ok(Staff {
                credential: authed.credential,
                _scope: std::marker::PhantomData,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use actix_web::{test, web, App, HttpResponse};
    use corvid_tenancy::{CredentialSource, MintKey, NewPersonalApiKey, ScopeSet};

    use super::*;
    use crate::auth::scope::OrganizationRead;
    use crate::state::AppState;

    async fn staff_only(_: Staff<OrganizationRead>) -> HttpResponse {
        HttpResponse::Ok().finish()
    }

    #[actix_web::test]
    async fn only_staff_users_pass() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = AppState::for_test(dir.path()).await;
        let tenancy = state.engine.tenancy.clone();
        let boot = tenancy.bootstrap(MintKey::Always).await.expect("defaults");
        let admin_key = boot.personal_api_key.expect("minted");
        let member = tenancy
            .create_user(
                boot.admin.organization_id,
                "member@example.com",
                "pw-123456789",
                false,
            )
            .await
            .expect("user");
        let as_member = Credential {
            user: member.clone(),
            scopes: ScopeSet::All,
            scoped_teams: None,
            scoped_organizations: None,
            source: CredentialSource::PersonalApiKey {
                id: "setup".into(),
                sha256_hex: String::new(),
                last_used_at: None,
            },
        };
        let (_, member_key) = tenancy
            .create_personal_api_key(
                &as_member,
                NewPersonalApiKey {
                    user_id: member.id,
                    label: "member".into(),
                    scopes: vec!["*".into()],
                    scoped_teams: None,
                    scoped_organizations: None,
                },
            )
            .await
            .expect("key");
        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(state))
                .route("/staff", web::get().to(staff_only)),
        )
        .await;
        let call = |key: &str| {
            test::TestRequest::get()
                .uri("/staff")
                .insert_header(("Authorization", format!("Bearer {key}")))
                .to_request()
        };
        assert_eq!(
            test::call_service(&app, call(&admin_key)).await.status(),
            200
        );
        assert_eq!(
            test::call_service(&app, call(&member_key)).await.status(),
            403
        );
        assert_eq!(
            test::call_service(&app, call("phx_unknown")).await.status(),
            401
        );
    }
}
