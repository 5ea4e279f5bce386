#!/usr/bin/env bash
# `moeserve generate --prompt` runs text prompts through the engine: the embedded tiny model plus the
# bundled tokenizer. Checks: greedy output is non-empty and deterministic across runs and across
# batching (two prompts together ≡ each alone); bad input gives a clear error and exit code != 0.
set -euo pipefail
bin=${MOESERVE_BIN:?MOESERVE_BIN not set}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" --log-level warn model gen-tiny "$dir/m" --config configs/embedded/config.json >/dev/null
cp assets/tokenizer/tokenizer.json assets/tokenizer/tokenizer_config.json "$dir/m/"

both=$("$bin" --log-level error generate --model "$dir/m" --prompt "To be, or not to be" --prompt "ROMEO:" --max-tokens 8)
a=$("$bin" --log-level error generate --model "$dir/m" --prompt "To be, or not to be" --max-tokens 8)
b=$("$bin" --log-level error generate --model "$dir/m" --prompt "ROMEO:" --max-tokens 8)
[ "$(printf '%s\n' "$both" | wc -l)" -eq 2 ] || { echo "expected 2 completions, got: $both"; exit 1; }
[ -n "$a" ] && [ -n "$b" ] || { echo "empty completion"; exit 1; }
[ "$both" = "$(printf '%s\n%s' "$a" "$b")" ] || { echo "batched != alone:"; echo "$both"; echo "$a"; echo "$b"; exit 1; }
printf 'To be, or not to be\nROMEO:\n' > "$dir/prompts.txt"
fromfile=$("$bin" --log-level error generate --model "$dir/m" --prompts-file "$dir/prompts.txt" --max-tokens 8)
[ "$fromfile" = "$both" ] || { echo "--prompts-file differs from --prompt"; exit 1; }

# The Engram map comes from the tokenizer at load: no false "pad-only" warning before it.
log=$("$bin" generate --model "$dir/m" --prompt "ROMEO:" --max-tokens 2 2>&1)
if grep -q "pad-only" <<<"$log"; then echo "false pad-only warning: $log"; exit 1; fi
grep -q "derived from the tokenizer" <<<"$log" || { echo "no tokenizer-derived map: $log"; exit 1; }
if out=$("$bin" generate --model "$dir/m" 2>&1); then echo "no prompt accepted"; exit 1; fi
grep -q "give --prompt-ids, --prompt or --prompts-file" <<<"$out" || { echo "unclear error: $out"; exit 1; }
if out=$("$bin" generate --model "$dir/missing" --prompt hi 2>&1); then echo "missing model accepted"; exit 1; fi
grep -q "missing" <<<"$out" || { echo "error does not name the folder: $out"; exit 1; }
if out=$("$bin" generate --model "$dir/m" --prompts-file "$dir/none.txt" 2>&1); then echo "missing file accepted"; exit 1; fi
grep -q "none.txt" <<<"$out" || { echo "error does not name the file: $out"; exit 1; }
if out=$("$bin" generate --model "$dir/m" --prompt hi --block-size 15 2>&1); then echo "odd block accepted"; exit 1; fi
grep -q -- "--block-size 15 is not a multiple" <<<"$out" || { echo "unclear block-size error: $out"; exit 1; }
# Small blocks: the second prompt extends the first, so it hits the cache; outputs stay valid.
small=$("$bin" --log-level error generate --model "$dir/m" --prompt "To be, or not to be" --block-size 4 --max-tokens 8)
[ -n "$small" ] || { echo "empty completion with --block-size 4"; exit 1; }
echo "generate_text: ok"
