-- A live flag's key is unique within its project, for writers on every node.
CREATE UNIQUE INDEX feature_flags_live_key ON feature_flags (project_id, (record->>'key'))
    WHERE NOT COALESCE((record->>'deleted')::boolean, false);
