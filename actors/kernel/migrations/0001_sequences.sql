-- Id sequences (`sequence`): one row per named counter, for ids every node draws from.
CREATE TABLE id_sequences (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
