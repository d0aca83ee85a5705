-- The activity log: one row per recorded change, written in the transaction of the change.
-- `id` is a time-ordered UUID (v7), so ordering by it is ordering by time.
CREATE TABLE activity_log (
    project_id bigint      NOT NULL,
    id         uuid        NOT NULL,
    scope      text        NOT NULL,
    item_id    text        NOT NULL,
    user_id    bigint,
    created_at timestamptz NOT NULL,
    record     jsonb       NOT NULL,
    PRIMARY KEY (project_id, id)
);
CREATE INDEX activity_log_item ON activity_log (project_id, scope, item_id, id);
CREATE INDEX activity_log_created ON activity_log (created_at);
