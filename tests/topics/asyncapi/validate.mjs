// Validate an AsyncAPI document with the official parser; print one JSON line, exit 1 on errors.
// Usage: node validate.mjs FILE
import { readFile } from "node:fs/promises";
import { Parser, DiagnosticSeverity } from "@asyncapi/parser";
import { AvroSchemaParser } from "@asyncapi/avro-schema-parser";

const file = process.argv[2];
const parser = new Parser();
parser.registerSchemaParser(AvroSchemaParser());
const { document, diagnostics } = await parser.parse(await readFile(file, "utf8"));
const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error);
const warnings = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Warning);
const describe = (d) => `${d.code} at ${d.path.join(".")}: ${d.message}`;
console.log(
  JSON.stringify({
    file,
    parsed: document !== undefined,
    errors: errors.map(describe),
    warnings: warnings.map(describe),
    channels: document ? document.channels().length : 0,
    operations: document ? document.operations().length : 0,
  }),
);
process.exit(document !== undefined && errors.length === 0 ? 0 : 1);
