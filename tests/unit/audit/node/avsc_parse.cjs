// Parse each .avsc file on its own with avsc (a fresh registry per file, no other file loaded) and
// print its full name and canonical form (avsc's parsing canonical form, what fingerprints hash).
// Usage: node avsc_parse.cjs FILE...
'use strict';
const fs = require('fs');
const avro = require('avsc');

const out = {};
for (const file of process.argv.slice(2)) {
  try {
    const type = avro.Type.forSchema(JSON.parse(fs.readFileSync(file, 'utf8')), { registry: {} });
    out[file] = { name: type.name, canonical: JSON.stringify(type.schema()) };
  } catch (err) {
    out[file] = { error: String(err && err.message ? err.message : err) };
  }
}
process.stdout.write(JSON.stringify(out));
