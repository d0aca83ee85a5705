// Drives the official posthog-node SDK against a Corvid server.
// Usage: node capture.mjs HOST PROJECT_TOKEN TAG — exits non-zero if the SDK reported an error.
import { PostHog } from 'posthog-node'

const [host, token, tag] = process.argv.slice(2)
const errors = []
const anon = `anon-${tag}`, user = `user-${tag}`, alias = `alias-${tag}`, company = `acme-${tag}`

const client = new PostHog(token, { host, flushAt: 3, flushInterval: 0, fetchRetryCount: 0 })
client.on('error', (err) => errors.push(String(err)))
client.capture({ distinctId: anon, event: '$pageview', properties: { $current_url: 'https://example.com/' } })
client.identify({ distinctId: user, properties: { email: `${tag}@example.com`, $anon_distinct_id: anon } })
client.alias({ distinctId: user, alias })
client.groupIdentify({ groupType: 'company', groupKey: company, properties: { name: 'Acme', employees: 42 }, distinctId: user })
client.capture({ distinctId: user, event: 'purchase', properties: { amount: 9.5 }, groups: { company } })
await client.shutdown()

const history = new PostHog(token, { host, historicalMigration: true, flushAt: 10, flushInterval: 0, fetchRetryCount: 0 })
history.on('error', (err) => errors.push(String(err)))
const old = Date.now() - 10 * 24 * 3600 * 1000
for (let i = 0; i < 3; i++) {
  history.capture({ distinctId: user, event: 'imported', timestamp: new Date(old + i * 60000), properties: { i } })
}
await history.shutdown()

if (errors.length) {
  console.error(errors.join('\n'))
  process.exit(1)
}
console.log('ok')
