// The playground's audio worklets, at the AudioContext's rate, which is the call's: 16 kHz
// where the browser can run the microphone at it (it resamples itself), else the context's
// own (48 kHz, 44.1 kHz: rates the native protocol takes, the gateway's worker resamples).
//
// "capture": microphone -> 20 ms frames of PCM16 little-endian (rate / 50 samples), posted to
// the page. "playback": the bot's PCM16 frames into a bounded ring (4 s; beyond it the oldest
// audio is dropped and counted), played in order; {clear: true} drops everything buffered
// (barge-in). It posts its counters back every 100 ms ({played, dropped, buffered}).

class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.frame = Math.round(sampleRate / 50);
    this.buf = new Int16Array(this.frame);
    this.n = 0;
  }
  process(inputs, outputs) {
    const ch = inputs[0] && inputs[0][0];
    if (ch) {
      for (let i = 0; i < ch.length; i++) {
        const s = Math.max(-1, Math.min(1, ch[i]));
        this.buf[this.n++] = s < 0 ? s * 0x8000 : s * 0x7fff;
        if (this.n === this.frame) {
          this.port.postMessage(this.buf.buffer, [this.buf.buffer]);
          this.buf = new Int16Array(this.frame);
          this.n = 0;
        }
      }
    }
    return true;
  }
}

class Playback extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(sampleRate * 4);
    this.read = 0;   // free-running sample positions
    this.write = 0;
    this.played = 0;
    this.dropped = 0;
    this.sinceReport = 0;
    this.port.onmessage = (e) => {
      const d = e.data;
      if (d && d.clear) {
        this.dropped += this.write - this.read;
        this.read = this.write;
        return;
      }
      const pcm = new Int16Array(d);
      const cap = this.ring.length;
      for (let i = 0; i < pcm.length; i++) {
        if (this.write - this.read >= cap) { this.read++; this.dropped++; }
        this.ring[this.write % cap] = pcm[i] / 0x8000;
        this.write++;
      }
    };
  }
  process(inputs, outputs) {
    const out = outputs[0][0];
    const cap = this.ring.length;
    let n = 0;
    for (let i = 0; i < out.length; i++) {
      if (this.read < this.write) { out[i] = this.ring[this.read % cap]; this.read++; n++; }
      else out[i] = 0;
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.played += n;
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 10) {  // every 100 ms
      this.sinceReport = 0;
      this.port.postMessage({ played: this.played, dropped: this.dropped, buffered: this.write - this.read });
    }
    return true;
  }
}

registerProcessor("capture", Capture);
registerProcessor("playback", Playback);
