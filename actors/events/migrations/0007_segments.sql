-- The cluster's nodes: each `cluster.node_id` gets a small number once, which names its
-- segments (WAL sequences are per node).
CREATE TABLE nodes (
    node_id   text PRIMARY KEY,
    number    serial UNIQUE,
    joined_at timestamptz NOT NULL DEFAULT now()
);

-- Every committed segment version in the bucket. A row exists only once its object does.
CREATE TABLE segments (
    project      bigint NOT NULL,
    day          date NOT NULL,
    node         integer NOT NULL,
    shard        integer NOT NULL,
    first_seq    bigint NOT NULL,
    last_seq     bigint NOT NULL,
    version      integer NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project, day, node, shard, first_seq, last_seq, version)
);

-- Each node's shards' WAL checkpoints, committed in the same transaction as a flush's rows.
CREATE TABLE wal_checkpoints (
    node  integer NOT NULL,
    shard integer NOT NULL,
    seq   bigint NOT NULL,
    PRIMARY KEY (node, shard)
);
