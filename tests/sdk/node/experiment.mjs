// Takes part in an experiment with the official posthog-node SDK: each user gets the
// experiment flag's variant (reported as `$feature_flag_called`) and buys something, captured
// with the flags attached. Usage: node experiment.mjs HOST PROJECT_TOKEN FLAG_KEY USERS
// Prints {"variants": {user: variant}}; exits non-zero if the SDK reported an error.
import { PostHog } from 'posthog-node'

const [host, token, flag, users] = process.argv.slice(2)
const errors = []
const client = new PostHog(token, { host, flushAt: 50, flushInterval: 0, fetchRetryCount: 0 })
client.on('error', (err) => errors.push(String(err)))
const variants = {}
for (let i = 0; i < Number(users); i++) {
  const user = `node-user-${i}`
  variants[user] = await client.getFeatureFlag(flag, user)
  client.capture({ distinctId: user, event: 'purchase', properties: { amount: 100 + i }, sendFeatureFlags: true })
}
await client.shutdown()
if (errors.length) {
  console.error(errors.join('\n'))
  process.exit(1)
}
console.log(JSON.stringify({ variants }))
