// Drives a PDS with the official TypeScript client (@atproto/api): createSession, putRecord
// with swapRecord, getRecord, listRecords. Usage: node client.mjs PDS_URL HANDLE PASSWORD
// Prints one JSON line with what it observed; exits non-zero on any unexpected answer.
import { AtpAgent } from '@atproto/api'

const [service, handle, password] = process.argv.slice(2)
const agent = new AtpAgent({ service })
const out = {}
const must = (cond, msg) => { if (!cond) { console.error(msg); process.exit(1) } }

await agent.login({ identifier: handle, password })
const did = agent.session.did
out.did = did
const collection = 'app.socialweb.interop'
const first = await agent.com.atproto.repo.putRecord({ repo: did, collection, rkey: 'ts', record: { $type: collection, n: 1 } })
out.firstCid = first.data.cid
must(first.data.commit && first.data.commit.cid, 'first put made no commit')
const second = await agent.com.atproto.repo.putRecord({ repo: did, collection, rkey: 'ts', record: { $type: collection, n: 2 }, swapRecord: first.data.cid })
out.secondCid = second.data.cid
try {
  await agent.com.atproto.repo.putRecord({ repo: did, collection, rkey: 'ts', record: { $type: collection, n: 3 }, swapRecord: first.data.cid })
  must(false, 'stale swapRecord was accepted')
} catch (e) {
  out.staleSwapError = e.error
  out.staleSwapStatus = e.status
  out.staleSwapMessage = e.message
}
const got = await agent.com.atproto.repo.getRecord({ repo: did, collection, rkey: 'ts' })
must(got.data.cid === second.data.cid && got.data.value.n === 2, 'getRecord did not return the second version')
out.got = got.data.value
const list = await agent.com.atproto.repo.listRecords({ repo: did, collection, limit: 10 })
out.listed = list.data.records.map((r) => r.uri)
console.log(JSON.stringify(out))
