// Compares River's answers for one GGUF file with llama.cpp's (ref.mjs ref) and prints one
// line per check, "PASS ..." or "FAIL ...", for scripts/test-llamacpp.sh to count.
//
//   node compare.mjs LLAMA.json RIVER.jsonl --label L --tol T [--expect-mismatch]
//
// RIVER.jsonl has one line per prompt, in the prompts' order:
//   {"tok": <river tokenize>, "tok_special": <river tokenize --special>, "run": <river run json>}
// (tok and tok_special may be left out: then run's prompt_ids is the tokenization checked).
//
// Checks:
//   tokenize   every prompt: River's ids without specials equal llama.cpp's, River's with
//              specials (and `river run`'s prompt_ids) equal llama.cpp's ids with BOS as
//              the file's add_bos says;
//   greedy     per prompt: River's greedy id equals llama.cpp's at every step where
//              llama.cpp's top-1 minus top-2 logit margin exceeds T. At a step at or below T
//              the two may legitimately pick different tokens; if they do, they continue
//              from different histories, so comparing stops there (if they agree, it goes
//              on). Prints the compared count.
//   compared   the file compared at least one greedy step (a file where nothing could be
//              compared proves nothing, so it fails rather than passes).
// With --expect-mismatch (River ran a deliberately corrupted copy of the file) the one check
// is that the greedy comparison finds a mismatch.
import { readFileSync } from "node:fs";

function die(msg) {
    process.stderr.write(`compare.mjs: ${msg}\n`);
    process.exit(2);
}

const argv = process.argv.slice(2);
if (argv.length < 2) die("usage: compare.mjs LLAMA.json RIVER.jsonl --label L --tol T [--expect-mismatch]");
const opts = { label: "gguf", tol: NaN, expect: false };
for (let i = 2; i < argv.length; i++) {
    if (argv[i] === "--label") opts.label = argv[++i];
    else if (argv[i] === "--tol") opts.tol = Number(argv[++i]);
    else if (argv[i] === "--expect-mismatch") opts.expect = true;
    else die(`unknown option '${argv[i]}'`);
}
if (!(opts.tol >= 0)) die("--tol wants a number >= 0");

let ref, river;
try {
    ref = JSON.parse(readFileSync(argv[0], "utf8"));
} catch (e) {
    die(`${argv[0]}: not llama.cpp's JSON: ${e.message}`);
}
try {
    river = readFileSync(argv[1], "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
} catch (e) {
    die(`${argv[1]}: not River's JSON lines: ${e.message}`);
}
if (river.length !== ref.prompts.length)
    die(`${argv[1]}: ${river.length} lines for ${ref.prompts.length} prompts`);

const L = opts.label;
const same = (a, b) => Array.isArray(a) && Array.isArray(b) && a.length === b.length &&
    a.every((x, i) => x === b[i]);
const show = (a) => JSON.stringify(a.length > 24 ? [...a.slice(0, 24), "..."] : a);
let fails = 0;
const check = (ok, msg) => {
    console.log(`${ok ? "PASS" : "FAIL"} ${L} ${msg}`);
    if (!ok) fails++;
};

// One comparison of a prompt's greedy ids. A step whose margin exceeds the tolerance must
// agree (`n` counts them). At a step at or below it either token is right; when River took
// the same one the histories are still the same and comparing goes on (`near` counts those
// steps), when it took another they diverge legitimately and comparing stops (`stop` says
// where).
function greedyCompare(p, r) {
    const ids = r.run.ids || [];
    let n = 0, near = 0, stop = null;
    for (let s = 0; s < p.greedy.length; s++) {
        if (s >= ids.length) return { n, near, stop, bad: `River stopped after ${ids.length} ids` };
        if (p.margin[s] > opts.tol) {
            if (ids[s] !== p.greedy[s])
                return { n, near, stop, bad: `step ${s}: River ${ids[s]}, llama.cpp ${p.greedy[s]} (margin ${p.margin[s]})` };
            n++;
        } else if (ids[s] === p.greedy[s]) {
            near++;
        } else {
            stop = `diverged at step ${s} (margin ${p.margin[s]})`;
            break;
        }
    }
    return { n, near, stop, bad: null };
}

if (opts.expect) {
    const bad = ref.prompts.map((p, i) => greedyCompare(p, river[i])).filter((c) => c.bad);
    check(bad.length > 0, `corrupted copy: ${bad.length} of ${ref.prompts.length} prompts ` +
          `mismatch llama.cpp on the original${bad.length ? ` (first: ${bad[0].bad})` : ""}`);
} else {
    const tokBad = [];
    ref.prompts.forEach((p, i) => {
        const r = river[i];
        const q = JSON.stringify(p.prompt);
        if (r.tok && !same(r.tok.ids, p.ids))
            tokBad.push(`${q}: River ${show(r.tok.ids)}, llama.cpp ${show(p.ids)}`);
        if (r.tok_special && !same(r.tok_special.ids, p.ids_bos))
            tokBad.push(`${q} with specials: River ${show(r.tok_special.ids)}, llama.cpp ${show(p.ids_bos)}`);
        if (!same(r.run.prompt_ids, p.ids_bos))
            tokBad.push(`${q} river run's prompt_ids ${show(r.run.prompt_ids)}, llama.cpp ${show(p.ids_bos)}`);
    });
    const what = river[0].tok ? "river tokenize with and without specials, river run" : "river run";
    check(tokBad.length === 0, `tokenize (${what}): ${ref.prompts.length} prompts, add_bos ${ref.add_bos}` +
          (tokBad.length ? `; ${tokBad.join("; ")}` : ""));
    let total = 0, steps = 0;
    ref.prompts.forEach((p, i) => {
        const c = greedyCompare(p, river[i]);
        total += c.n;
        steps += p.greedy.length;
        check(!c.bad, `greedy ${JSON.stringify(p.prompt)}: ${c.n}/${p.greedy.length} steps ` +
              `compared (margin > ${opts.tol}), ${c.near} within it agreeing` +
              `${c.stop ? `, ${c.stop}` : ""}${c.bad ? `; ${c.bad}` : ""}`);
    });
    check(total > 0, `compared ${total} of ${steps} greedy steps over ${ref.prompts.length} prompts ` +
          `(tensor types ${JSON.stringify(ref.tensor_types)})`);
}
process.exit(fails ? 1 : 0);
