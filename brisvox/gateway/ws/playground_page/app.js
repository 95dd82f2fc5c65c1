// The brisvox playground: pick an agent, talk from the microphone, hear the answer over the
// native protocol (docs/PROTOCOL.md), see the transcript, the turn latencies and the tool calls.
// Counters for tests and the curious: window.playground.
"use strict";

const RATE = 16000;  // the rate the page asks for; the AudioContext's own when the browser refuses it
const pg = window.playground = {
  state: "loading", call_id: "", agent: "", error: "", rate: 0,
  frames_sent: 0, bot_frames: 0, bot_samples_played: 0, bot_samples_dropped: 0, clears: 0,
  events: 0, transcript: [], metrics: [], tools: [], close_code: 0,
};
const $ = (id) => document.getElementById(id);
let ws = null, ctx = null, mic = null, player = null;

function setState(s, err) {
  pg.state = s;
  if (err) pg.error = String(err);
  $("state").textContent = s + (pg.error ? " (" + pg.error + ")" : "");
  const live = s === "connecting" || s === "connected";
  $("connect").disabled = live || !$("agent").value;
  $("hangup").disabled = !live;
  $("counters").textContent = "frames sent " + pg.frames_sent + " · bot frames " + pg.bot_frames +
    " · bot samples played " + pg.bot_samples_played + " · clears " + pg.clears + " · events " + pg.events;
}

function line(who, text) {
  pg.transcript.push({ who, text });
  const p = document.createElement("p");
  p.className = who;
  const b = document.createElement("b");
  b.textContent = who === "user" ? "You: " : "Bot: ";
  p.append(b, document.createTextNode(text));
  $("transcript").append(p);
}

function fmt(v) { return v === null || v === undefined ? "–" : Math.round(v); }

function onEvent(m) {
  pg.events++;
  if (m.name === "user_turn") line("user", m.text || "");
  else if (m.name === "bot_turn") line("bot", m.text || "");
  else if (m.name === "turn_metrics") {
    pg.metrics.push(m);
    const tr = document.createElement("tr");
    for (const v of [m.epoch, fmt(m.voice_to_voice_ms), fmt(m.end_of_turn_ms), fmt(m.llm_first_token_ms),
                     fmt(m.tts_first_audio_ms)]) {
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.append(td);
    }
    $("metrics").append(tr);
  } else if (m.name === "tool_call") {
    pg.tools.push({ tool: m.tool, outcome: m.outcome });
    const li = document.createElement("li");
    li.textContent = m.tool + " → " + m.outcome;
    $("tools").append(li);
  }
}

async function audioAt(rate) {
  ctx = rate ? new AudioContext({ sampleRate: rate }) : new AudioContext();
  mic = mic || await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true } });
  return ctx.createMediaStreamSource(mic);  // throws where the browser cannot resample the microphone
}

async function startAudio() {
  let src;
  try {
    src = await audioAt(RATE);
  } catch (e) {
    if (ctx) ctx.close().catch(() => {});
    src = await audioAt(0);
  }
  await ctx.audioWorklet.addModule("/playground/worklet.js");
  player = new AudioWorkletNode(ctx, "playback", { numberOfInputs: 0, outputChannelCount: [1] });
  player.port.onmessage = (e) => {
    pg.bot_samples_played = e.data.played;
    pg.bot_samples_dropped = e.data.dropped;
  };
  player.connect(ctx.destination);
  const cap = new AudioWorkletNode(ctx, "capture", { numberOfOutputs: 1, outputChannelCount: [1] });
  cap.port.onmessage = (e) => {
    if (ws && ws.readyState === WebSocket.OPEN) {
      ws.send(e.data);
      pg.frames_sent++;
    }
  };
  const mute = ctx.createGain();
  mute.gain.value = 0;
  src.connect(cap).connect(mute).connect(ctx.destination);  // pulled by the graph, heard by nobody
  await ctx.resume();
  return ctx.sampleRate;
}

function stopAudio() {
  if (mic) mic.getTracks().forEach((t) => t.stop());
  if (ctx) ctx.close().catch(() => {});
  mic = ctx = player = null;
}

async function connect() {
  const agent = $("agent").value;
  pg.agent = agent;
  pg.error = "";
  setState("connecting");
  let rate;
  try {
    rate = await startAudio();
    pg.rate = rate;
    const url = "/playground/token?agent=" + encodeURIComponent(agent);
    let r = await fetch(url, { method: "POST" });
    if (r.status === 401) {  // a listener others can reach: the operator's native_secret mints
      const secret = window.prompt("This playground is reachable from other hosts: the operator's credential "
                                   + "([websocket] native_secret)");
      if (secret) r = await fetch(url, { method: "POST", headers: { Authorization: "Bearer " + secret } });
    }
    if (!r.ok) throw new Error("token: HTTP " + r.status);
    const t = await r.json();
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    ws = new WebSocket(scheme + location.host + t.path + "?token=" + encodeURIComponent(t.token));
    ws.binaryType = "arraybuffer";
  } catch (e) {
    stopAudio();
    setState("failed", e);
    return;
  }
  ws.onopen = () => ws.send(JSON.stringify({ event: "start", rate, events: true,
                                             params: { source: "playground" } }));
  ws.onmessage = (e) => {
    if (typeof e.data !== "string") {
      pg.bot_frames++;
      if (player) player.port.postMessage(e.data, [e.data]);
      return;
    }
    const m = JSON.parse(e.data);
    if (m.event === "started") {
      pg.call_id = m.call_id;
      setState("connected");
    } else if (m.event === "clear") {
      pg.clears++;
      if (player) player.port.postMessage({ clear: true });
    } else if (m.event === "call_event") onEvent(m);
    else if (m.event === "stop") pg.stop_reason = m.reason;
    else if (m.event === "error") console.warn("playground:", m.code, m.message);
  };
  ws.onclose = (e) => {
    pg.close_code = e.code;
    stopAudio();
    ws = null;
    setState(pg.state === "failed" ? "failed" : "ended");
  };
}

function hangup() {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ event: "stop" }));
  else if (ws) ws.close();
}

async function init() {
  $("connect").onclick = connect;
  $("hangup").onclick = hangup;
  try {
    const r = await fetch("/playground/agents");
    const { agents } = await r.json();
    for (const a of agents) {
      const o = document.createElement("option");
      o.value = o.textContent = a;
      $("agent").append(o);
    }
    setState(agents.length ? "ready" : "no agents");
  } catch (e) {
    setState("failed", e);
  }
  setInterval(() => setState(pg.state), 250);
}

init();
