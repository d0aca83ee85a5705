-- Erasure requests (one row per person), as the embedded tree `person_erasures` keeps them.
CREATE TABLE person_erasures (
    project_id   bigint NOT NULL,
    id           uuid NOT NULL,
    requested_at timestamptz NOT NULL,
    record       jsonb NOT NULL,
    PRIMARY KEY (project_id, id)
);
CREATE INDEX person_erasures_requested_at ON person_erasures (requested_at);
