-- Tenancy metadata: organizations, projects, users and personal API keys.
-- Each record is the JSON document the embedded store keeps; the columns beside it are the
-- ones looked up or kept unique.
CREATE TABLE organizations (
    id     uuid PRIMARY KEY,
    record jsonb NOT NULL
);

CREATE TABLE projects (
    id        bigint PRIMARY KEY,
    api_token text NOT NULL UNIQUE,
    record    jsonb NOT NULL
);

CREATE TABLE users (
    id     bigint PRIMARY KEY,
    email  text NOT NULL UNIQUE,
    record jsonb NOT NULL
);

CREATE TABLE personal_api_keys (
    id                  text PRIMARY KEY,
    user_id             bigint NOT NULL,
    secure_value_sha256 text NOT NULL UNIQUE,
    record              jsonb NOT NULL
);
CREATE INDEX personal_api_keys_user ON personal_api_keys (user_id);
