// What the client scripts share: the npm packages installed under $RIVER_NPM_DIR, the
// gateway's address and key from the environment, and checks counted and summed up in the
// form Check's runner prints, which scripts/run-tests.sh counts.
import { createRequire } from 'node:module';

export const require = createRequire(process.env.RIVER_NPM_DIR + '/');
export const OpenAI = require('openai');
export const baseURL = process.env.RIVER_GATEWAY_URL;
export const apiKey = process.env.RIVER_API_KEY;

let checks = 0;
let failures = 0;
export async function check(name, fn) {
    checks++;
    try {
        await fn();
        console.log(`ok - ${name}`);
    } catch (e) {
        failures++;
        console.log(`not ok - ${name}: ${e && e.stack ? e.stack : e}`);
    }
}
export function expect(cond, what) {
    if (!cond) throw new Error(`expected ${what}`);
}
// Prints the summary line and exits with the verdict.
export function finish() {
    const pct = checks ? Math.floor((100 * (checks - failures)) / checks) : 100;
    console.log(`${pct}%: Checks: ${checks}, Failures: ${failures}, Errors: 0`);
    process.exit(failures ? 1 : 0);
}
