-- Persons, their distinct ids, groups and usage counters, keyed by project first like the
-- embedded trees.
CREATE TABLE persons (
    project_id bigint NOT NULL,
    id         uuid NOT NULL,
    record     jsonb NOT NULL,
    PRIMARY KEY (project_id, id)
);

CREATE TABLE person_distinct_ids (
    project_id  bigint NOT NULL,
    distinct_id text NOT NULL,
    person_id   uuid NOT NULL,
    PRIMARY KEY (project_id, distinct_id)
);

CREATE TABLE group_type_mappings (
    project_id       bigint NOT NULL,
    group_type       text NOT NULL,
    group_type_index smallint NOT NULL,
    PRIMARY KEY (project_id, group_type),
    UNIQUE (project_id, group_type_index)
);

CREATE TABLE groups (
    project_id       bigint NOT NULL,
    group_type_index smallint NOT NULL,
    group_key        text NOT NULL,
    record           jsonb NOT NULL,
    PRIMARY KEY (project_id, group_type_index, group_key)
);

-- Monthly counters; `kind` is 0 billable events, 1 historical events, 2 flag requests.
CREATE TABLE usage_counters (
    project_id bigint NOT NULL,
    month      text NOT NULL,
    kind       smallint NOT NULL,
    count      bigint NOT NULL,
    PRIMARY KEY (project_id, month, kind)
);
