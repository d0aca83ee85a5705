-- Invitations to join an organization (the record is the embedded store's JSON document).
-- Users keep their level and whether they are active in their own record.
CREATE TABLE invites (
    id              uuid PRIMARY KEY,
    organization_id uuid NOT NULL,
    record          jsonb NOT NULL
);
CREATE INDEX invites_organization ON invites (organization_id);
