-- OAuth grants. Secrets (codes, tokens, session ids) are keyed by their SHA-256 hex; the one-time
-- flags (`used`, `revoked`) and `revoked_at` live in the JSON record, changed by single
-- conditional statements or under row locks so that concurrent nodes agree.
CREATE TABLE oauth_codes (
    hash       text PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    record     jsonb NOT NULL
);

CREATE TABLE oauth_families (
    id         uuid PRIMARY KEY,
    created_at timestamptz,
    record     jsonb NOT NULL
);

CREATE TABLE oauth_tokens (
    hash       text PRIMARY KEY,
    family_id  uuid NOT NULL,
    expires_at timestamptz NOT NULL,
    record     jsonb NOT NULL
);
CREATE INDEX oauth_tokens_family ON oauth_tokens (family_id);

CREATE TABLE oauth_sessions (
    hash       text PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    record     jsonb NOT NULL
);

CREATE TABLE oauth_verified_clients (
    client_id text PRIMARY KEY,
    record    jsonb NOT NULL
);
