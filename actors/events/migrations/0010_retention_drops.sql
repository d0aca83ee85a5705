-- Days of a project that retention removed (the embedded catalog keeps them in
-- `_retention/project-<id>.jsonl`).
CREATE TABLE retention_drops (
    project    bigint NOT NULL,
    day        date NOT NULL,
    dropped_at timestamptz NOT NULL,
    record     jsonb NOT NULL
);
CREATE INDEX retention_drops_project ON retention_drops (project, dropped_at);
