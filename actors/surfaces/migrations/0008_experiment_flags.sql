-- One live experiment per feature flag, for writers on every node.
CREATE UNIQUE INDEX experiments_live_flag
    ON definition_records (project_id, (record->>'feature_flag_id'))
    WHERE kind = 'experiments' AND NOT COALESCE((record->>'deleted')::boolean, false);
