/*
 * valve: Shiny sessions that survive dropped connections (docs/design/shiny-reconnect.md).
 * Served as <prefix>/__valve__/shiny-reconnect.js and loaded right before
 * </head>: after shiny.js, before Shiny connects on DOM ready.
 *
 * Shiny asks `Shiny.createSocket()` for its socket. We hand it a logical
 * socket that stays open (readyState 1) across network gaps: underneath, it
 * opens physical WebSockets on Shiny's own URL with the subprotocol
 * valve-shiny.1 and speaks docs/design/shiny-reconnect.md §3.3 to valve:
 *
 *   valve -> us:  s <sid> <token> <windowMs>   first message, new session
 *                 w <lastRecv> <windowMs>      first message on a resumed socket
 *                 m<seq>:<text> | 0x6D u64-seq payload   numbered data
 *                 a<n> (cumulative ack), q (pong)
 *   us -> valve:  h <sid> <token> <lastRecv>   first message on a resume socket
 *                 numbered data, a<n>, p (ping), b (bye)
 *
 * A dropped socket is resumed (same R session, nothing lost or repeated).
 * When that can't be done, the socket "restarts": it closes towards Shiny
 * with allowReconnect so Shiny opens a new session with the user's inputs.
 * If valve answers without our subprotocol (reconnect off), the logical
 * socket is a thin pass-through, exactly today's behaviour.
 *
 * valve serves framing.js and this file as one script, inside one function
 * (src/http/resume/inject.rs), so neither leaves a global behind but
 * `window.__valve` (for tests and debugging) and `Shiny.createSocket`.
 */
(function () {
  "use strict";

  var PROTOCOL = "valve-shiny.1";
  var RESUME = "valve-resume";
  var RESTART = "valve-restart";
  var ACK_DELAY_MS = 250;        // ack this long after the first unacked receive
  var ACK_EVERY = 64;            // ...or at once when this many are unacked
  var PING_MS = 15000;           // ping while attached
  var SILENCE_MS = 35000;        // nothing heard this long (and a ping unanswered) = dead
  var PING_ANSWER_MS = 10000;    // ...and a ping unanswered this long (see _watchdog)
  var WATCH_MS = 2500;           // how often the watchdog looks
  var ATTEMPT_MS = 10000;        // one resume attempt: open + `w`
  var RETRY_S = [0, 0.5, 1, 2, 3, 5]; // resume delays, last repeated, ±20 %
  var MAX_MSGS = 2000;           // our unacked messages...
  var MAX_BYTES = 8 * 1024 * 1024; // ...and their size, before we give up and restart
  var NOTICE_MS = 1000;          // show "Reconnecting…" after this long detached
  var CODE_ENDED = 4500, CODE_REPLACED = 4600, CODE_GONE = 4700;

  // The framing (framing.js, served just before this file).
  var frameText = valveFraming.frameText, binaryHeader = valveFraming.binaryHeader,
    frameBinary = valveFraming.frameBinary, parseText = valveFraming.parseText,
    parseBinary = valveFraming.parseBinary, socketUrl = valveFraming.socketUrl;

  if (!window.Shiny) return;

  // ---- Page-wide state -------------------------------------------------

  var stats = { sid: null, resumes: 0, restarts: 0, drops: 0, state: "new" };
  window.__valve = stats;
  var current = null;          // the newest logical socket
  var appAllow;                // the last `allowReconnect` the app itself sent
  var restartPending = false;  // sockets made now belong to a restart (strip button counts)
  var lastQuickReconnect = 0;
  var noticeTimer = null;

  function report(e) {
    try { if (window.reportError) window.reportError(e); else console.error(e); } catch (_) { /* nothing */ }
  }
  function later(fn, ms) { return setTimeout(function () { try { fn(); } catch (e) { report(e); } }, ms); }
  function publish() {
    if (!current) return;
    stats.sid = current.sid;
    stats.state = current.mode;
  }
  function optedOut() { return appAllow === false; }
  function app() { return window.Shiny && window.Shiny.shinyapp; }
  function allowShinyReconnect() {
    // The app's own choice wins: false (opted out) or "force" stay as they are.
    if (appAllow === false || appAllow === "force" || !app()) return;
    app().$allowReconnect = true;
  }
  // While a new session starts, Shiny's grey overlay and its reconnect
  // dialog stay hidden; if none has started after RESTART_QUIET_MS (valve
  // unreachable), they show: Shiny's own countdown and "Try now" take over.
  var RESTART_QUIET_MS = 10000;
  var restartTimer = null;
  function restartingClass(on) {
    var cl = document.documentElement.classList;
    clearTimeout(restartTimer);
    restartTimer = null;
    if (on) {
      cl.add("valve-restarting");
      restartTimer = later(function () { cl.remove("valve-restarting"); hideNotice(); }, RESTART_QUIET_MS);
    } else {
      cl.remove("valve-restarting");
    }
  }

  // ---- The notice and the CSS -----------------------------------------

  function injectStyle() {
    var style = document.createElement("style");
    style.textContent =
      "html.valve-restarting #shiny-disconnected-overlay," +
      "html.valve-restarting #shiny-notification-reconnect{display:none !important}" +
      "#valve-reconnecting{position:fixed;left:12px;bottom:12px;z-index:100000;" +
      "padding:3px 10px;border-radius:4px;background:rgba(33,37,41,.85);color:#fff;" +
      "font:12px/1.5 system-ui,-apple-system,sans-serif;pointer-events:none}";
    (document.head || document.documentElement).appendChild(style);
  }

  function noticeSoon() {
    if (noticeTimer || document.getElementById("valve-reconnecting")) return;
    noticeTimer = later(function () {
      noticeTimer = null;
      var m = current && current.mode;
      if (!(m === "detached" || m === "restarting" || (m === "new" && current.fromRestart))) return;
      if (!document.body || document.getElementById("valve-reconnecting")) return;
      var div = document.createElement("div");
      div.id = "valve-reconnecting";
      div.setAttribute("role", "status");
      div.setAttribute("aria-live", "polite");
      div.textContent = "Reconnecting\u2026";
      document.body.appendChild(div);
    }, NOTICE_MS);
  }

  function hideNotice() {
    clearTimeout(noticeTimer);
    noticeTimer = null;
    var div = document.getElementById("valve-reconnecting");
    if (div) div.remove();
  }

  // Shiny's `shiny:connected`: a (new) session is up.
  function onShinyConnected() {
    restartingClass(false);
    hideNotice();
    if (current && current.mode !== "plain") allowShinyReconnect();
  }

  // ---- The logical socket ---------------------------------------------
  // mode: "new" (waiting for `s`), "attached", "detached" (resuming),
  // "restarting", "closed", "plain" (valve reconnect off: pass-through).

  function LogicalSocket() {
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    this.readyState = 0;
    this.allowReconnect = false;
    this.binaryType = "arraybuffer";
    this.fromRestart = restartPending;
    this.initSeen = false;
    this.mode = "new";
    this.opened = false;
    this.sid = this.token = null;
    this.windowMs = 0;
    this.ws = null;
    this.sentSeq = 0;          // last number we gave a message
    this.acked = 0;            // highest ack from valve
    this.buf = [];             // {seq, frame, size} not yet acked
    this.bufBytes = 0;
    this.lastRecv = 0;         // last number delivered to Shiny
    this.unacked = 0;          // received since our last ack
    this.ackTimer = null;
    this.lastHeard = this.lastPing = Date.now();
    this.pingAt = 0;           // when the oldest unanswered ping went out (0: none)
    this.dropAt = 0;
    this.attempt = 0;
    this.retryTimer = this.attemptTimer = this.windowTimer = null;
    var self = this;
    this.watch = setInterval(function () { self._guard(self._watchdog); }, WATCH_MS);
    current = this;
    publish();
    this.wsOpened = false;     // did any physical socket of ours open?
    this.triedPlain = false;
    this._open("new");
  }

  var P = LogicalSocket.prototype;

  // Run one of our handlers; never let an error of ours reach Shiny.
  P._guard = function (fn, a, b) {
    try { fn.call(this, a, b); } catch (e) { report(e); }
  };

  // kind: "new" | "resume" | "plain" (no subprotocol offered).
  P._open = function (kind) {
    var self = this, ws, resume = kind === "resume";
    try {
      var url = socketUrl(window.location, navigator.userAgent);
      // A new session that replaces one that is gone says so (valve counts restarts).
      var offered = resume ? [PROTOCOL, RESUME] : this.fromRestart ? [PROTOCOL, RESTART] : [PROTOCOL];
      ws = kind === "plain" ? new WebSocket(url) : new WebSocket(url, offered);
    } catch (e) {
      report(e);
      later(function () { self._closed(null, 1006); }, 0);
      return;
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = function () { self.wsOpened = true; self._guard(self._opened, ws, resume); };
    ws.onmessage = function (e) { self._guard(self._received, ws, e.data); };
    ws.onclose = function (e) { self._guard(self._closed, ws, e.code); };
    ws.onerror = function () { /* a close event follows */ };
  };

  // Forget the physical socket (its events are ignored from now) and close it.
  P._dropWs = function () {
    var ws = this.ws;
    this.ws = null;
    if (!ws) return;
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    try { if (ws.readyState < 2) ws.close(1000); } catch (_) { /* closing anyway */ }
  };

  P._write = function (data) {
    try { this.ws.send(data); } catch (e) { report(e); }
  };

  P._opened = function (ws, resume) {
    if (ws !== this.ws) return;
    if (ws.protocol !== PROTOCOL) {
      if (resume) return this._restart("valve no longer resumes");
      // Reconnect is off in valve: be a plain WebSocket, as without this script.
      clearInterval(this.watch);
      this.mode = "plain";
      publish();
      this._fireOpen();
      return;
    }
    this.lastHeard = Date.now();
    if (resume) this._write("h " + this.sid + " " + this.token + " " + this.lastRecv);
  };

  P._received = function (ws, data) {
    if (ws !== this.ws) return;
    if (this.mode === "plain") return this._deliver(data);
    this.lastHeard = Date.now();
    this.pingAt = 0;
    if (typeof data !== "string") {
      var bin = this.mode === "attached" ? parseBinary(data) : null;
      if (!bin) return this._restart("bad binary message");
      return this._data(bin.seq, bin.payload);
    }
    var msg = parseText(data);
    if (!msg) return this._restart("unparsable message");
    if (this.mode === "new") {
      if (msg.kind !== "s") return this._restart("expected s");
      this.sid = msg.sid;
      this.token = msg.token;
      this.windowMs = msg.windowMs;
      this._attach();
      this._fireOpen();
    } else if (this.mode === "detached") {
      if (msg.kind !== "w") return this._restart("expected w");
      this._resumed(msg);
    } else if (this.mode === "attached") {
      if (msg.kind === "m") this._data(msg.seq, msg.payload);
      else if (msg.kind === "a") this._ack(msg.n);
      else if (msg.kind !== "q") this._restart("unexpected " + msg.kind);
    }
  };

  // Now writing on this.ws: send what valve has not got, in order.
  P._attach = function () {
    this.mode = "attached";
    this.lastHeard = this.lastPing = Date.now();
    this.pingAt = 0;
    this.unacked = 0;
    for (var i = 0; i < this.buf.length; i++) this._write(this.buf[i].frame);
    publish();
  };

  P._resumed = function (msg) {
    if (msg.lastRecv > this.sentSeq || msg.lastRecv < this.acked) return this._restart("bad w");
    clearTimeout(this.attemptTimer);
    clearTimeout(this.retryTimer);
    clearTimeout(this.windowTimer);
    this._ack(msg.lastRecv);
    this.windowMs = msg.windowMs;
    stats.resumes++;
    this._attach();
    hideNotice();
  };

  P._data = function (seq, payload) {
    if (seq > this.lastRecv + 1) return this._restart("gap at " + seq);
    if (seq <= this.lastRecv) return this._ackSoon();  // a resend we already have
    this.lastRecv = seq;
    this._ackSoon();
    if (typeof payload === "string" && payload.indexOf('"allowReconnect"') >= 0) {
      try {
        var obj = JSON.parse(payload);
        if (obj && typeof obj === "object" && Object.prototype.hasOwnProperty.call(obj, "allowReconnect"))
          appAllow = obj.allowReconnect;
      } catch (_) { /* not ours to judge */ }
    }
    this._deliver(payload);
  };

  P._deliver = function (data) {
    // An error in Shiny's handlers is reported, as a real WebSocket would.
    try { if (this.onmessage) this.onmessage({ type: "message", data: data }); } catch (e) { report(e); }
  };

  P._ackSoon = function () {
    var self = this;
    this.unacked++;
    if (this.unacked >= ACK_EVERY) this._sendAck();
    else if (!this.ackTimer) this.ackTimer = later(function () { self._sendAck(); }, ACK_DELAY_MS);
  };

  P._sendAck = function () {
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
    if (this.mode === "attached" && this.unacked > 0) this._write("a" + this.lastRecv);
    this.unacked = 0;
  };

  P._ack = function (n) {
    if (n > this.sentSeq) return this._restart("ack above sent");
    if (n > this.acked) this.acked = n;
    var k = 0;
    while (k < this.buf.length && this.buf[k].seq <= n) this.bufBytes -= this.buf[k++].size;
    if (k) this.buf.splice(0, k);
  };

  P._fireOpen = function () {
    if (this.opened) return;
    this.opened = true;
    this.readyState = 1;
    if (this.fromRestart) restartPending = false;
    try { if (this.onopen) this.onopen({ type: "open" }); } catch (e) { report(e); }
    onShinyConnected(); // also hooked on jQuery's shiny:connected; harmless twice
  };

  // Tell Shiny the socket closed, as a WebSocket would: later, never inside send().
  P._fireClose = function (code, reason, quick) {
    var self = this;
    later(function () {
      try { if (self.onclose) self.onclose({ type: "close", code: code, reason: reason || "", wasClean: false }); }
      catch (e) { report(e); }
      // A restart of a live session: reconnect at once rather than in Shiny's
      // 1.5 s (inputs changed while Shiny has no socket would be lost). At most
      // every 30 s; otherwise Shiny's own backoff applies.
      var a = app();
      if (quick && a && !a.isConnected() && Date.now() - lastQuickReconnect > 30000) {
        lastQuickReconnect = Date.now();
        a.reconnect();
      }
    }, 0);
  };

  P._closed = function (ws, code) {
    if (ws !== this.ws) return;   // a socket we left already (4600 included)
    this.ws = null;
    if (this.mode === "plain") return this._finish(code);
    if (code === CODE_ENDED) return this._finish(code);
    if (this.mode === "new") {
      // Browsers fail a handshake whose 101 names no subprotocol when one was
      // offered: that is what a server without valve's reconnect answers. So
      // a first socket that never opened is tried once more offering none.
      if (!this.wsOpened && !this.triedPlain) {
        this.triedPlain = true;
        return this._open("plain");
      }
      return this._failNew(code);
    }
    if (code === CODE_GONE) return this._restart("session gone (4700)", true);
    if (this.mode === "attached") return this._drop(code === CODE_REPLACED ? "replaced" : "closed " + code);
    if (this.mode === "detached") return this._attemptFailed();
  };

  // A new session's socket failed before `s`: Shiny never saw it open, so it
  // shows its overlay; it retries (its own backoff) if this was a restart.
  P._failNew = function (code) {
    var retry = this.fromRestart && !optedOut();
    this._stop();
    this.readyState = 3;
    this.allowReconnect = retry;
    this.mode = retry ? "restarting" : "closed";
    if (!retry) { restartingClass(false); hideNotice(); }
    publish();
    this._fireClose(code, "", false);
  };

  // The physical socket is gone but the session may live on: resume.
  P._drop = function (why) {
    var self = this;
    if (window.console) console.info("valve: connection lost (" + why + "), resuming");
    this._dropWs();
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
    this.mode = "detached";
    this.dropAt = Date.now();
    this.attempt = 0;
    stats.drops++;
    publish();
    noticeSoon();
    this.windowTimer = later(function () { self._restart("window over"); }, this.windowMs);
    this._tryResume();
  };

  P._tryResume = function () {
    var self = this;
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    if (this.mode !== "detached") return;
    if (Date.now() - this.dropAt >= this.windowMs) return this._restart("window over");
    this.attempt++;
    this._open("resume");
    clearTimeout(this.attemptTimer);
    this.attemptTimer = later(function () { self._attemptFailed(); }, ATTEMPT_MS);
  };

  P._attemptFailed = function () {
    var self = this;
    clearTimeout(this.attemptTimer);
    this._dropWs();
    if (this.mode !== "detached") return;
    var base = RETRY_S[Math.min(this.attempt, RETRY_S.length - 1)] * 1000;
    this.retryTimer = later(function () { self._tryResume(); }, base * (0.8 + 0.4 * Math.random()));
  };

  // The network may be back (`online`) or timers may have slept (tab visible).
  P._poke = function (online) {
    if (this.mode === "attached") {
      this._ping();
    } else if (this.mode === "detached") {
      if (this.retryTimer) this._tryResume();
      else if (online && this.ws) { this._dropWs(); this._tryResume(); } // opened on the old network
    }
  };

  P._ping = function () {
    this.lastPing = Date.now();
    if (!this.pingAt) this.pingAt = this.lastPing;
    this._write("p");
  };

  P._watchdog = function () {
    var now = Date.now();
    if (this.mode === "attached") {
      // Dead: nothing heard for 35 s, and a ping unanswered for 10 s. (The
      // second part: a background tab's timers may sleep past 35 s without
      // pinging; then it pings first and judges on the answer.)
      if (this.pingAt && now - this.pingAt >= PING_ANSWER_MS && now - this.lastHeard >= SILENCE_MS)
        return this._drop("silence");
      if (now - this.lastPing >= PING_MS) this._ping();
    } else if (this.mode === "new" && now - this.lastHeard >= SILENCE_MS) {
      this._failNew(1006);
    }
  };

  P._stop = function () {
    clearInterval(this.watch);
    clearTimeout(this.ackTimer);
    clearTimeout(this.retryTimer);
    clearTimeout(this.attemptTimer);
    clearTimeout(this.windowTimer);
    this.ackTimer = this.retryTimer = this.attemptTimer = this.windowTimer = null;
    this._dropWs();
  };

  // The session can't be resumed: close towards Shiny so it opens a new one.
  // `gone`: valve said the session is over (4700), no need to say bye.
  P._restart = function (why, gone) {
    if (this.mode === "closed" || this.mode === "restarting" || this.mode === "plain") return;
    if (window.console) console.info("valve: new Shiny session (" + why + ")");
    if (this.mode === "new") return this._failNew(1002);
    if (this.mode === "attached" && !gone) this._write("b"); // let valve free the old one now
    this._stop();
    this.readyState = 3;
    if (optedOut()) {
      this.allowReconnect = false;
      this.mode = "closed";
      hideNotice();
    } else {
      this.allowReconnect = true;
      this.mode = "restarting";
      restartPending = true;
      stats.restarts++;
      allowShinyReconnect();
      restartingClass(true);
      noticeSoon();
    }
    publish();
    this._fireClose(CODE_GONE, why, this.allowReconnect);
  };

  // Closed for good (4500, or valve's reconnect off): Shiny's grey overlay is right.
  P._finish = function (code) {
    this._stop();
    this.readyState = 3;
    this.allowReconnect = false;
    this.mode = "closed";
    hideNotice();
    restartingClass(false);
    publish();
    this._fireClose(code, "", false);
  };

  // Shiny's contract: strings and Blobs (also ArrayBuffers and views).
  LogicalSocket.prototype.send = function (data) {
    try {
      if (this.mode === "plain") {
        if (this.ws && this.ws.readyState === 1) this.ws.send(data);
        return;
      }
      if (this.mode === "closed" || this.mode === "restarting") return;
      var text = typeof data === "string";
      if (text && this.fromRestart && !this.initSeen) data = this._stripActions(data);
      var seq = ++this.sentSeq;
      var size = text ? data.length : (data.size !== undefined ? data.size : data.byteLength);
      var frame = text ? frameText(seq, data) : frameBinary(seq, data);
      this.buf.push({ seq: seq, frame: frame, size: size });
      this.bufBytes += size;
      // Over the cap: give up this session. A message alone may be bigger than
      // the cap (else an `init` carrying a huge input would restart forever).
      if (this.buf.length > MAX_MSGS || (this.bufBytes > MAX_BYTES && this.buf.length > 1))
        return this._restart("too much unacknowledged");
      if (this.mode === "attached") this._write(frame);
    } catch (e) {
      report(e);
    }
  };

  // The first `init` after a restart must not press buttons again: the
  // `<id>:shiny.action` counts go as 0, as a fresh page's buttons (Shiny
  // takes 0 as "never pressed"; the next press fires once).
  P._stripActions = function (data) {
    if (data.indexOf('"init"') < 0) return data;
    var msg;
    try { msg = JSON.parse(data); } catch (_) { return data; }
    if (!msg || msg.method !== "init") return data;
    this.initSeen = true;
    if (!msg.data || typeof msg.data !== "object") return data;
    var changed = false;
    Object.keys(msg.data).forEach(function (k) {
      if (/:shiny\.action$/.test(k) && msg.data[k] !== 0) { msg.data[k] = 0; changed = true; }
    });
    return changed ? JSON.stringify(msg) : data;
  };

  LogicalSocket.prototype.close = function () {
    try {
      if (this.mode === "plain") { if (this.ws) this.ws.close(1000); return; }
      if (this.mode === "closed" || this.mode === "restarting") return;
      if (this.mode === "attached") this._write("b");
      this._finish(1000);
    } catch (e) {
      report(e);
    }
  };

  // Leaving the page for good (not into the back-forward cache): end the session now.
  P._bye = function () {
    if (this.mode === "plain" || this.mode === "closed" || this.mode === "restarting") return;
    if (this.mode === "attached") this._write("b");
    this._stop();
    this.readyState = 3;
    this.mode = "closed";
    publish();
  };

  // ---- Install ---------------------------------------------------------

  window.Shiny.createSocket = function () { return new LogicalSocket(); };
  injectStyle();
  if (window.jQuery) window.jQuery(document).on("shiny:connected", onShinyConnected);
  window.addEventListener("pagehide", function (e) {
    if (!e.persisted && current) current._guard(current._bye);
  });
  window.addEventListener("online", function () { if (current) current._guard(current._poke, true); });
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible" && current) current._guard(current._poke, false);
  });
})();
