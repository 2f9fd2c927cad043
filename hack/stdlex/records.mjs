// Prints the record types the reference PDS validates against, one "NSID KEY" a line, sorted.
// Run by hack/stdlex.sh with --eval from the reference PDS's install directory, so the bare
// specifiers resolve to its own packages: this is the set its repo/prepare.js builds
// (walk(lexicons) filtered to record schemas).
import { walk } from '@atproto/lex'
import * as lexicons from './node_modules/@atproto/pds/dist/lexicons/index.js'

const out = new Set()
for (const s of walk(lexicons)) {
  if (s && s.type === 'record') out.add(`${s.$type} ${s.key}`)
}
console.log([...out].sort().join('\n'))
