// The console's page script: live run timelines (server-sent events), refreshing lists,
// and actions posted in place. Everything it draws comes rendered (and escaped) from the server.
"use strict";

(function () {
  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.content : "";
  const remembered = { by: "", token: "" }; // kept in this page's memory only, never stored

  function fillOperator(root) {
    for (const name of ["by", "token"]) {
      if (!remembered[name]) continue;
      for (const input of root.querySelectorAll(`form.action input[name="${name}"]`)) {
        if (!input.value) input.value = remembered[name];
      }
    }
  }

  document.addEventListener("input", (e) => {
    const t = e.target;
    if (!(t instanceof HTMLInputElement) || !t.closest("form.action")) return;
    if (t.name !== "by" && t.name !== "token") return;
    remembered[t.name] = t.value;
    for (const other of document.querySelectorAll(`form.action input[name="${t.name}"]`)) {
      if (other !== t) other.value = t.value;
    }
  });

  function flash(text, ok) {
    const el = document.getElementById("flash");
    if (!el) return;
    el.hidden = false;
    el.textContent = text;
    el.className = "message " + (ok ? "ok" : "bad");
  }

  document.addEventListener("submit", async (e) => {
    const form = e.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("action")) return;
    e.preventDefault();
    const submitter = e.submitter;
    const url = submitter && submitter.hasAttribute("formaction") ? submitter.getAttribute("formaction")
      : form.getAttribute("action");
    const out = form.querySelector(".outcome");
    const buttons = form.querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    if (out) { out.textContent = "working…"; out.className = "outcome"; }
    let text, ok;
    try {
      const resp = await fetch(url, {
        method: "POST",
        body: new URLSearchParams(new FormData(form)),
        headers: { "Accept": "application/json", "X-CSRF-Token": csrf },
        credentials: "same-origin",
      });
      const doc = await resp.json();
      text = doc.message; ok = doc.ok;
    } catch (err) {
      text = "the request failed: " + err; ok = false;
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
    if (out) { out.textContent = text; out.className = "outcome " + (ok ? "ok" : "bad"); }
    flash(text, ok);
  });

  // A live view's state label (live, reconnecting, a problem the server reported) follows its
  // EventSource; returns the setter for the view's own updates.
  function liveState(source, el) {
    const set = (text, cls) => { if (el) { el.textContent = text; el.className = "live-state " + cls; } };
    source.onopen = () => set("live", "live");
    source.onerror = () => set("reconnecting", "down");
    source.addEventListener("problem", (m) => set(JSON.parse(m.data).message, "down"));
    return set;
  }

  // -- a run's page: follow its log --------------------------------------------------------------
  const run = document.querySelector("[data-live]");
  if (run) {
    const source = new EventSource(run.dataset.live + "?after=" + encodeURIComponent(run.dataset.events));
    const setState = liveState(source, document.getElementById("live-state"));
    source.addEventListener("update", (m) => {
      const doc = JSON.parse(m.data);
      const seen = new Set(Array.from(run.querySelectorAll("li.event")).map((li) => li.dataset.offset));
      for (const [id, html] of Object.entries(doc.parts)) {
        const el = document.getElementById(id);
        if (el) el.innerHTML = html;
      }
      for (const li of run.querySelectorAll("li.event")) {
        if (!seen.has(li.dataset.offset)) li.classList.add("new");
      }
      const actions = document.getElementById("actions");
      if (actions && actions.dataset.key !== doc.actions_key) {
        actions.innerHTML = doc.actions;
        actions.dataset.key = doc.actions_key;
        fillOperator(actions);
      }
      run.dataset.events = String(doc.events);
      if (doc.status) document.title = `${doc.run_id} ${doc.status} · Runlog console`;
      setState("live", "live");
    });
  }

  // -- a run's page: its streamed output (the streams topic), drawn call by call -----------------
  // Each call's attempts are list items keyed by call and (epoch, attempt); text is added with
  // textContent only. SUPERSEDED marks the call's earlier attempts; FINAL marks one done. The
  // browser's EventSource reconnects with Last-Event-ID, so nothing is drawn twice or skipped.
  const streamed = document.getElementById("run-stream");
  if (streamed) {
    const calls = document.getElementById("stream-calls");
    const attempts = new Map();
    const attemptOf = (r) => {
      const key = `${r.call_id}|${r.epoch}|${r.attempt}`;
      let li = attempts.get(key);
      if (!li) {
        li = document.createElement("li");
        li.className = "attempt";
        li.dataset.call = r.call_id;
        li.dataset.attempt = `${r.epoch}.${r.attempt}`;
        const head = document.createElement("div");
        head.className = "head";
        head.textContent = `${r.stage} · ${r.call_id} · attempt ${r.epoch}.${r.attempt}`;
        const text = document.createElement("pre");
        text.className = "text";
        const events = document.createElement("ul");
        events.className = "events";
        li.append(head, text, events);
        calls.append(li);
        attempts.set(key, li);
      }
      return li;
    };
    const describe = (data) => {
      try {
        const doc = JSON.parse(data);
        if (doc.event_kind === "function_tool_call" && doc.part) {
          return `tool ${doc.part.tool_name}(${JSON.stringify(doc.part.args)})`;
        }
        return doc.event_kind || data;
      } catch (err) {
        return data;
      }
    };
    const source = new EventSource(streamed.dataset.stream);
    const setState = liveState(source, document.getElementById("stream-state"));
    source.addEventListener("undecodable", (m) => {
      const doc = JSON.parse(m.data);
      const li = document.createElement("li");
      li.className = "undecodable";
      li.textContent = `offset ${doc.offset}: a record that does not decode (${doc.reason})`;
      calls.append(li);
      streamed.hidden = false;
    });
    source.addEventListener("record", (m) => {
      const r = JSON.parse(m.data);
      streamed.hidden = false;
      if (r.kind === "SUPERSEDED") {
        for (const li of calls.querySelectorAll("li.attempt")) {
          if (li.dataset.call === r.call_id && li.dataset.attempt !== `${r.epoch}.${r.attempt}`) {
            li.classList.add("superseded");
          }
        }
      }
      const li = attemptOf(r);
      li.dataset.offset = String(r.offset);
      if (r.kind === "DELTA") {
        li.querySelector("pre.text").textContent += r.text || "";
      } else if (r.kind === "EVENT") {
        const item = document.createElement("li");
        item.textContent = describe(r.data || "");
        li.querySelector("ul.events").append(item);
      } else if (r.kind === "FINAL") {
        li.classList.add("final");
      }
      setState("live", "live");
    });
  }

  // -- lists that refresh themselves ---------------------------------------------------------------
  for (const part of document.querySelectorAll("[data-refresh]")) {
    const every = Number(part.dataset.every || "3000");
    const refresh = async () => {
      if (document.hidden) return;
      try {
        const resp = await fetch(part.dataset.refresh + window.location.search, { credentials: "same-origin" });
        if (resp.ok) part.innerHTML = await resp.text();
      } catch (err) {
        // the next round tries again
      }
    };
    window.setInterval(refresh, every);
  }
})();
