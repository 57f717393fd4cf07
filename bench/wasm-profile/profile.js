#!/usr/bin/env node
// Times and profiles the fingerprint core's steps in node's V8 (see src/lib.rs).
//
//   node bench/wasm-profile/profile.js WASM STEP:INPUT [STEP:INPUT ...]
//
// STEP is fingerprint, parse, json, sketch, blocks or no-blocks (the fingerprint without
// the block chain, as the filter computes it with no batcher); INPUT a file (a chat body) or, for
// sketch, the text itself. Prints, per input, µs per call hot (a tight loop) and cold (the
// median of single calls after sweeping 32 MB of memory, as inside Envoy). Run it under
// `node --cpu-prof --cpu-prof-interval 50` and pass the .cpuprofile to `--report FILE` to
// get self time per wasm function (share of the samples inside wasm).
//
//   node bench/wasm-profile/profile.js --ab A.wasm B.wasm STEP:INPUT
//
// compares two builds in one process, alternating short hot loops of each 60 times, and
// prints B's time as a ratio of A's (p25 and median of the loops). This box moves between a
// fast and a slow state from one second to the next, so times taken in separate runs do
// not compare; loops alternated in one process see the same states.
const fs = require('fs');
const STEPS = ['fingerprint', 'parse', 'json', 'sketch', 'blocks', 'no-blocks'];

function report(file) {
  const profile = JSON.parse(fs.readFileSync(file));
  const nodes = new Map(profile.nodes.map(n => [n.id, n]));
  // Self time of the wasm functions only (the JS driver and its cache sweep left out).
  const self = new Map();
  let total = 0;
  for (const id of profile.samples) {
    const frame = nodes.get(id).callFrame;
    if (!frame.url.startsWith('wasm://')) continue;
    self.set(frame.functionName, (self.get(frame.functionName) || 0) + 1);
    total += 1;
  }
  [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, 25)
    .forEach(([name, n]) => console.log(`${(100 * n / total).toFixed(1).padStart(5)}%  ${name}`));
}

function instance(path, data, step) {
  const wasm = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(path)), {}).exports;
  const ptr = wasm.cohort_profile_alloc(data.length);
  new Uint8Array(wasm.memory.buffer, ptr, data.length).set(data);
  wasm.cohort_profile_run(step, ptr, data.length, 3000);  // warm-up: TurboFan from here
  return n => wasm.cohort_profile_run(step, ptr, data.length, n);
}

function ab(pathA, pathB, spec) {
  const colon = spec.indexOf(':');
  const [step, input] = [spec.slice(0, colon), spec.slice(colon + 1)];
  if (!STEPS.includes(step)) throw new Error(`unknown step ${step}; one of ${STEPS.join(', ')}`);
  const data = fs.existsSync(input) ? fs.readFileSync(input) : Buffer.from(input);
  const runs = [instance(pathA, data, STEPS.indexOf(step)), instance(pathB, data, STEPS.indexOf(step))];
  const times = [[], []];
  const n = Math.max(20, Math.round(2e5 / data.length));
  for (let r = 0; r < 60; r++) {
    for (const k of r % 2 ? [1, 0] : [0, 1]) {
      const t = process.hrtime.bigint();
      runs[k](n);
      times[k].push(Number(process.hrtime.bigint() - t) / 1000 / n);
    }
  }
  const at = (v, q) => [...v].sort((x, y) => x - y)[Math.floor(q * (v.length - 1))];
  [pathA, pathB].forEach((path, k) => console.log(
    `${step} ${data.length} B  ${path}: p25 ${at(times[k], 0.25).toFixed(2)} µs, median ${at(times[k], 0.5).toFixed(2)} µs`));
  console.log(`B / A: p25 ${(at(times[1], 0.25) / at(times[0], 0.25)).toFixed(3)}, ` +
              `median ${(at(times[1], 0.5) / at(times[0], 0.5)).toFixed(3)}`);
}

function main(args) {
  if (args[0] === '--report') return report(args[1]);
  if (args[0] === '--ab') return ab(args[1], args[2], args[3]);
  const wasm = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(args[0])), {}).exports;
  const sweep = new Uint32Array(8 << 20);
  let sink = 0;
  for (const spec of args.slice(1)) {
    const colon = spec.indexOf(':');
    const [step, input] = [spec.slice(0, colon), spec.slice(colon + 1)];
    const index = STEPS.indexOf(step);
    if (index < 0) throw new Error(`unknown step ${step}; one of ${STEPS.join(', ')}`);
    const data = fs.existsSync(input) ? fs.readFileSync(input) : Buffer.from(input);
    const ptr = wasm.cohort_profile_alloc(data.length);
    new Uint8Array(wasm.memory.buffer, ptr, data.length).set(data);
    wasm.cohort_profile_run(index, ptr, data.length, 3000);  // warm-up: TurboFan from here
    const n = 5000;
    let t = process.hrtime.bigint();
    wasm.cohort_profile_run(index, ptr, data.length, n);
    const hot = Number(process.hrtime.bigint() - t) / 1000 / n;
    const cold = [];
    for (let r = 0; r < 301; r++) {
      for (let j = 0; j < sweep.length; j += 16) sink += sweep[j]++;
      t = process.hrtime.bigint();
      wasm.cohort_profile_run(index, ptr, data.length, 1);
      cold.push(Number(process.hrtime.bigint() - t) / 1000);
    }
    cold.sort((a, b) => a - b);
    const what = input.length > 40 ? input.slice(0, 37) + '...' : input;
    console.log(`${step.padEnd(11)} ${String(data.length).padStart(7)} B  hot ${hot.toFixed(2).padStart(7)} µs  cold ${cold[150].toFixed(2).padStart(7)} µs  (${what})`);
  }
  return sink;
}

main(process.argv.slice(2));
