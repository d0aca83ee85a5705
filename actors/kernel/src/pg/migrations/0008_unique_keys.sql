-- Uniqueness the stores enforce for writers on every node: a live flag's key within its
-- project, and one live experiment per feature flag.
CREATE UNIQUE INDEX feature_flags_live_key ON feature_flags (project_id, (record->>'key'))
    WHERE NOT COALESCE((record->>'deleted')::boolean, false);

CREATE UNIQUE INDEX experiments_live_flag
    ON definition_records (project_id, (record->>'feature_flag_id'))
    WHERE kind = 'experiments' AND NOT COALESCE((record->>'deleted')::boolean, false);
