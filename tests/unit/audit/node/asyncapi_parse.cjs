// Parse schemas/asyncapi.yaml with @asyncapi/parser (the Avro schema parser registered, as the
// AsyncAPI CLI does) and print what tools get: diagnostics, and per message its payload, headers
// and Avro schema (x-avro-schema), every $ref resolved. Usage: node asyncapi_parse.cjs FILE
'use strict';
const { Parser, fromFile } = require('@asyncapi/parser');
const { AvroSchemaParser } = require('@asyncapi/avro-schema-parser');

async function main(file) {
  const parser = new Parser();
  parser.registerSchemaParser(AvroSchemaParser());
  const { document, diagnostics } = await fromFile(parser, file).parse();
  const out = {
    diagnostics: diagnostics.map((d) => ({ severity: d.severity, code: String(d.code), message: d.message,
                                            path: d.path.map(String) })),
    messages: {},
  };
  if (document) {
    for (const m of document.allMessages()) {
      const avro = m.extensions().get('x-avro-schema');
      out.messages[m.id()] = {
        contentType: m.contentType() || null,
        payload: m.hasPayload() ? m.payload().json() : null,
        headers: m.hasHeaders() ? m.headers().json() : null,
        avro: avro ? avro.value() : null,
      };
    }
  }
  process.stdout.write(JSON.stringify(out));
}

main(process.argv[2]).catch((err) => { console.error(err && err.stack ? err.stack : err); process.exit(1); });
