// A Restate service whose handler takes N durable steps (`ctx.run`), each the same work as a
// step of `openprogram load --function steps`: the benchmark's other side (run.sh).
// Node.js 20 lacks Promise.withResolvers, which the SDK calls while handling a request (not
// while it loads: imports run first).
if (!Promise.withResolvers) Promise.withResolvers = function () { let resolve, reject; const promise = new Promise((a, b) => { resolve = a; reject = b; }); return { promise, resolve, reject }; };
import * as restate from "@restatedev/restate-sdk";
const svc = restate.service({
  name: "Steps",
  handlers: {
    run: async (ctx, steps) => {
      let acc = 0;
      for (let i = 0; i < steps; i++) {
        acc += await ctx.run(`step-${i}`, async () => i);
      }
      return acc;
    },
  },
});
restate.serve({ services: [svc], port: Number(process.env.PORT || 9080) });
