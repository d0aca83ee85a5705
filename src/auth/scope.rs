//! Type-level scope requirements, so each route states its scope in its signature.

/// A scope a route requires, e.g. `project:read`.
pub trait RequiredScope: 'static {
    const SCOPE: &'static str;
}

macro_rules! required_scopes {
    ($($(#[$doc:meta])* $name:ident => $scope:literal,)*) => {
        $(
            $(#[$doc])*
            pub struct $name;
            impl RequiredScope for $name {
                const SCOPE: &'static str = $scope;
            }
        )*
    };
}

required_scopes! {
    ActivityLogRead => "activity_log:read",
    ProjectRead => "project:read",
    ProjectWrite => "project:write",
    UserRead => "user:read",
    UserWrite => "user:write",
    PersonRead => "person:read",
    PersonWrite => "person:write",
    BatchExportRead => "batch_export:read",
    BatchExportWrite => "batch_export:write",
    GroupRead => "group:read",
    QueryRead => "query:read",
    EndpointRead => "endpoint:read",
    EndpointWrite => "endpoint:write",
    InsightVariableRead => "insight_variable:read",
    InsightVariableWrite => "insight_variable:write",
    FeatureFlagRead => "feature_flag:read",
    FeatureFlagWrite => "feature_flag:write",
    CohortRead => "cohort:read",
    CohortWrite => "cohort:write",
    OrganizationRead => "organization:read",
    OrganizationWrite => "organization:write",
    PersonalApiKeyRead => "personal_api_key:read",
    PersonalApiKeyWrite => "personal_api_key:write",
    ExperimentRead => "experiment:read",
    ExperimentWrite => "experiment:write",
    SurveyRead => "survey:read",
    SurveyWrite => "survey:write",
    EarlyAccessFeatureRead => "early_access_feature:read",
    EarlyAccessFeatureWrite => "early_access_feature:write",
    WebhookRead => "webhook:read",
    WebhookWrite => "webhook:write",
}
