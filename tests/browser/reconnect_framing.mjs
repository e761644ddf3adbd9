// The framing helpers of src/http/resume/framing.js (valve-shiny/1, design
// §3.3), in plain node: node reconnect_framing.mjs (exits non-zero on failure).
import { createRequire } from "node:module";
import assert from "node:assert/strict";

const require = createRequire(import.meta.url);
const f = require("../../src/http/resume/framing.js");

// Text data and control messages.
assert.equal(f.frameText(7, '{"a":1}'), 'm7:{"a":1}');
assert.deepEqual(f.parseText('m12:{"x":"a:b"}'), { kind: "m", seq: 12, payload: '{"x":"a:b"}' });
assert.deepEqual(f.parseText("m1:"), { kind: "m", seq: 1, payload: "" });
assert.deepEqual(f.parseText("a0"), { kind: "a", n: 0 });
assert.deepEqual(f.parseText("a64"), { kind: "a", n: 64 });
assert.deepEqual(f.parseText("q"), { kind: "q" });
assert.deepEqual(f.parseText("s 0123abcd tok3n 120000"), { kind: "s", sid: "0123abcd", token: "tok3n", windowMs: 120000 });
assert.deepEqual(f.parseText("w 41 5000"), { kind: "w", lastRecv: 41, windowMs: 5000 });
for (const bad of ["", "m0:x", "m:x", "mx:1", "m-1:x", "a", "a-1", "a1x", "qq", "s a b", "s a b c", "w 1",
  "w x 1", "x", "h a b 1", "p", "b", "s  tok 1", "m99999999999999999:x"]) {
  assert.equal(f.parseText(bad), null, `unparsable: ${JSON.stringify(bad)}`);
}

// Binary: 0x6D, u64 big-endian seq, payload.
const u8 = (buf) => Array.from(new Uint8Array(buf));
assert.deepEqual(u8(f.binaryHeader(1)), [0x6d, 0, 0, 0, 0, 0, 0, 0, 1]);
assert.deepEqual(u8(f.binaryHeader(2 ** 32 + 258)), [0x6d, 0, 0, 0, 1, 0, 0, 1, 2]);
const framed = f.frameBinary(5, new Uint8Array([9, 8, 7]).buffer);
assert.deepEqual(u8(framed), [0x6d, 0, 0, 0, 0, 0, 0, 0, 5, 9, 8, 7]);
const view = new Uint8Array([0, 1, 2, 3, 4]).subarray(1, 3); // a view into a larger buffer
assert.deepEqual(u8(f.frameBinary(6, view)), [0x6d, 0, 0, 0, 0, 0, 0, 0, 6, 1, 2]);
const blob = f.frameBinary(3, new Blob(["hi"]));
assert.ok(blob instanceof Blob);
assert.deepEqual(u8(await blob.arrayBuffer()), [0x6d, 0, 0, 0, 0, 0, 0, 0, 3, 104, 105]);

const parsed = f.parseBinary(framed);
assert.equal(parsed.seq, 5);
assert.deepEqual(u8(parsed.payload), [9, 8, 7]);
assert.ok(parsed.payload instanceof ArrayBuffer);
assert.equal(f.parseBinary(f.binaryHeader(9)).payload.byteLength, 0);
assert.equal(f.parseBinary(new Uint8Array([0x6d, 0, 0]).buffer), null);           // short
assert.equal(f.parseBinary(new Uint8Array([0x6e, 0, 0, 0, 0, 0, 0, 0, 1]).buffer), null); // not `m`
assert.equal(f.parseBinary(f.binaryHeader(0)), null);                               // seq 0

// Shiny's default socket URL (shiny.js ShinyApp.createSocket).
const loc = (protocol, host, pathname) => ({ protocol, host, pathname });
assert.equal(f.socketUrl(loc("http:", "h:8080", "/"), ""), "ws://h:8080/websocket/");
assert.equal(f.socketUrl(loc("https:", "h", "/apps/hello/"), ""), "wss://h/apps/hello/websocket/");
assert.equal(f.socketUrl(loc("http:", "h", "/apps/hello"), ""), "ws://h/apps/hello/websocket/");
assert.equal(f.socketUrl(loc("http:", "h", "/a b/"), ""), "ws://h/a%20b/websocket/");

console.log("framing ok");
