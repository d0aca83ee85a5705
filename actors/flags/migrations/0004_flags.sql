-- Flag and cohort definitions.
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
