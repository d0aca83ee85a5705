-- The definition records of the record store (`records`): the product surfaces' surveys,
-- early-access features, experiments and holdouts in one table, `kind` names the store.
CREATE TABLE definition_records (
    kind       text NOT NULL,
    project_id bigint NOT NULL,
    id         text NOT NULL,
    record     jsonb NOT NULL,
    PRIMARY KEY (kind, project_id, id)
);
