/*
 * valve-shiny/1's framing (docs/design/shiny-reconnect.md §3.3), pure:
 * numbered data both ways, valve's control messages, and Shiny's socket URL.
 * Served just before client.js as one script; node's tests
 * (tests/browser/reconnect_framing.mjs) require it on its own.
 */
var valveFraming = (function () {
  "use strict";

  var TWO32 = 4294967296;

  function frameText(seq, payload) { return "m" + seq + ":" + payload; }

  function binaryHeader(seq) {
    var buf = new ArrayBuffer(9), view = new DataView(buf);
    view.setUint8(0, 0x6d);
    view.setUint32(1, Math.floor(seq / TWO32));
    view.setUint32(5, seq % TWO32);
    return buf;
  }

  // A Blob stays a Blob (no copy); ArrayBuffer and views become one ArrayBuffer.
  function frameBinary(seq, data) {
    var header = binaryHeader(seq);
    if (typeof Blob !== "undefined" && data instanceof Blob) return new Blob([header, data]);
    var bytes = data instanceof ArrayBuffer ? new Uint8Array(data)
      : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    var out = new Uint8Array(9 + bytes.length);
    out.set(new Uint8Array(header), 0);
    out.set(bytes, 9);
    return out.buffer;
  }

  var NUM = /^[0-9]{1,15}$/;
  function num(s) { return NUM.test(s) ? Number(s) : -1; }

  // One text message from valve -> {kind, ...}, or null when unparsable.
  function parseText(s) {
    var c = s.charAt(0), n, parts;
    if (c === "m") {
      var colon = s.indexOf(":");
      n = colon > 0 ? num(s.slice(1, colon)) : -1;
      return n >= 1 ? { kind: "m", seq: n, payload: s.slice(colon + 1) } : null;
    }
    if (c === "a") { n = num(s.slice(1)); return n >= 0 ? { kind: "a", n: n } : null; }
    if (s === "q") return { kind: "q" };
    parts = s.split(" ");
    if (c === "s" && parts.length === 4 && parts[0] === "s" && parts[1] && parts[2] && num(parts[3]) >= 0)
      return { kind: "s", sid: parts[1], token: parts[2], windowMs: num(parts[3]) };
    if (c === "w" && parts.length === 3 && parts[0] === "w" && num(parts[1]) >= 0 && num(parts[2]) >= 0)
      return { kind: "w", lastRecv: num(parts[1]), windowMs: num(parts[2]) };
    return null;
  }

  // One binary message from valve -> {seq, payload: ArrayBuffer}, or null.
  function parseBinary(buf) {
    if (!(buf instanceof ArrayBuffer) || buf.byteLength < 9) return null;
    var view = new DataView(buf);
    if (view.getUint8(0) !== 0x6d) return null;
    var seq = view.getUint32(1) * TWO32 + view.getUint32(5);
    return seq >= 1 && seq <= Number.MAX_SAFE_INTEGER ? { seq: seq, payload: buf.slice(9) } : null;
  }

  // Shiny's own socket URL, computed as shiny.js's ShinyApp.createSocket does.
  function socketUrl(loc, userAgent) {
    var path = loc.pathname;
    if (!/^([$#!&-;=?-[\]_a-z~]|%[0-9a-fA-F]{2})+$/.test(path)) {
      path = encodeURI(path);
      if (/\bQt\//.test(userAgent || "")) path = encodeURI(path);
    }
    if (!/\/$/.test(path)) path += "/";
    return (loc.protocol === "https:" ? "wss:" : "ws:") + "//" + loc.host + path + "websocket/";
  }

  return { frameText: frameText, binaryHeader: binaryHeader, frameBinary: frameBinary,
    parseText: parseText, parseBinary: parseBinary, socketUrl: socketUrl };
})();
if (typeof module !== "undefined" && module.exports) module.exports = valveFraming;
