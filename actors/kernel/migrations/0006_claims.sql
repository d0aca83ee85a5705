-- Leases on background jobs: a job is claimed by one node until `expires_at`.
CREATE TABLE job_claims (
    job        text PRIMARY KEY,
    holder     text NOT NULL,
    expires_at timestamptz NOT NULL
);
