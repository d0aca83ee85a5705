-- Flag and cohort definitions, and the definition records of the product surfaces (surveys,
-- early-access features, experiments, holdouts: one table, `kind` names the store).
CREATE TABLE feature_flags (
    project_id bigint NOT NULL,
    id         bigint NOT NULL,
    record     jsonb NOT NULL,
    PRIMARY KEY (project_id, id)
);

CREATE TABLE cohorts (
    project_id bigint NOT NULL,
    id         bigint NOT NULL,
    record     jsonb NOT NULL,
    PRIMARY KEY (project_id, id)
);

CREATE TABLE definition_records (
    kind       text NOT NULL,
    project_id bigint NOT NULL,
    id         text NOT NULL,
    record     jsonb NOT NULL,
    PRIMARY KEY (kind, project_id, id)
);
