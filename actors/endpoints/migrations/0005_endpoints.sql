-- Endpoints (one record with its versions, by project and name), soft-deleted ones by id,
-- insight variables, and the execution log.
CREATE TABLE endpoints (
    project_id bigint NOT NULL,
    name       text NOT NULL,
    record     jsonb NOT NULL,
    PRIMARY KEY (project_id, name)
);

CREATE TABLE endpoints_deleted (
    id     uuid PRIMARY KEY,
    record jsonb NOT NULL
);

CREATE TABLE insight_variables (
    project_id bigint NOT NULL,
    id         uuid NOT NULL,
    code_name  text NOT NULL,
    record     jsonb NOT NULL,
    PRIMARY KEY (project_id, id),
    UNIQUE (project_id, code_name)
);

CREATE TABLE endpoint_logs (
    seq         bigserial PRIMARY KEY,
    project_id  bigint NOT NULL,
    endpoint_id uuid NOT NULL,
    instance_id uuid NOT NULL,
    ts          timestamptz NOT NULL,
    level       text NOT NULL,
    message     text NOT NULL
);
CREATE INDEX endpoint_logs_by_endpoint ON endpoint_logs (project_id, endpoint_id, ts DESC);
CREATE INDEX endpoint_logs_by_time ON endpoint_logs (ts);
