// Drives service.mjs through Restate's ingress like `openprogram load`: EXECUTIONS invocations
// of STEPS steps, CONCURRENCY at once; one JSON line (steps/s, latencies).
//   node driver.mjs URL EXECUTIONS STEPS CONCURRENCY
const [url, n, steps, conc] = [process.argv[2], +process.argv[3], +process.argv[4], +process.argv[5]];
let next = 0, done = 0, failed = 0;
const lat = [];
async function worker() {
  while (next < n) {
    next++;
    const t = performance.now();
    try {
      const r = await fetch(`${url}/Steps/run`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(steps) });
      await r.text();
      if (r.ok) done++; else failed++;
    } catch (error) {
      failed++;
    }
    lat.push(performance.now() - t);
  }
}
const t0 = performance.now();
await Promise.all(Array.from({ length: conc }, worker));
const secs = (performance.now() - t0) / 1000;
lat.sort((a, b) => a - b);
console.log(JSON.stringify({ system: "restate", executions: n, steps, concurrency: conc, done, failed, secs, steps_per_sec: (done * steps) / secs, exec_p50_ms: lat[Math.floor(lat.length / 2)], exec_p99_ms: lat[Math.floor(lat.length * 0.99)] }));
