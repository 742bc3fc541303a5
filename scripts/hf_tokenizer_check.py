#!/usr/bin/env python3
"""Ask Hugging Face transformers for the ids of texts llmq tokenized with a tokenizer.json llmq
wrote from a llama2.c tokenizer: the check that the files mean to transformers what they mean to
llmq (and to run.c).

usage: hf_tokenizer_check.py CHECK_DIR
CHECK_DIR holds, per case, NAME/ (tokenizer.json, tokenizer_config.json, config.json) and
NAME.ids.json (rows of text, ids, ids_bos, llama2c_ids, decoded), as tests/test_tokenizer_export.cpp
leaves them when LLMQ_HF_CHECK_DIR=CHECK_DIR is set. Prints per case how many texts transformers
encodes to llmq's ids (without and with BOS) and decodes back to llmq's text, and the first
mismatches; texts holding U+2581 are counted apart (a space to tokenizer.json, byte tokens to
run.c). Writes the counts as JSON to $OUT/hf_tokenizer_check.json if $OUT is set. Exit status 1
on any mismatch."""
import glob
import json
import os
import sys

SPACE_SYMBOL = "\u2581"


def check_case(ids_file, AutoTokenizer, Tokenizer):
    name = os.path.basename(ids_file)[: -len(".ids.json")]
    rows = json.load(open(ids_file, encoding="utf-8"))
    directory = os.path.join(os.path.dirname(ids_file), name)
    tok = AutoTokenizer.from_pretrained(directory)
    raw = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))  # tokenizers alone, no config
    result = {"case": name, "class": type(tok).__name__, "texts": len(rows),
              "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "ids": 0, "ids_bos": 0, "decoded": 0, "tokenizers_ids": 0, "llama2c_ids": 0,
              "space_symbol_texts": 0, "mismatches": []}
    for row in rows:
        text = row["text"]
        got = tok.encode(text, add_special_tokens=False)
        got_bos = tok.encode(text, add_special_tokens=True)
        decoded = tok.decode(row["ids"], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        ok = [got == row["ids"], got_bos == row["ids_bos"], decoded == row["decoded"]]
        result["ids"] += ok[0]
        result["ids_bos"] += ok[1]
        result["decoded"] += ok[2]
        result["tokenizers_ids"] += raw.encode(text, add_special_tokens=False).ids == row["ids"]
        result["llama2c_ids"] += got == row["llama2c_ids"]
        result["space_symbol_texts"] += SPACE_SYMBOL in text
        if not all(ok) and len(result["mismatches"]) < 5:
            result["mismatches"].append({"text": text, "llmq": row["ids"], "transformers": got,
                                         "llmq_bos": row["ids_bos"], "transformers_bos": got_bos,
                                         "llmq_decoded": row["decoded"], "transformers_decoded": decoded})
    return result


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    import tokenizers
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    print(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    results = []
    failed = False
    for ids_file in sorted(glob.glob(os.path.join(sys.argv[1], "*.ids.json"))):
        r = check_case(ids_file, AutoTokenizer, Tokenizer)
        results.append(r)
        n = r["texts"]
        # The U+2581 texts count toward llama2c_ids' shortfall only: llmq and transformers agree.
        print(f"{r['case']}: {r['class']}, bos {r['bos_token_id']} eos {r['eos_token_id']}: "
              f"ids {r['ids']}/{n}, ids with BOS {r['ids_bos']}/{n}, decode {r['decoded']}/{n}, "
              f"tokenizers alone {r['tokenizers_ids']}/{n}; "
              f"= llama2.c ids {r['llama2c_ids']}/{n} ({r['space_symbol_texts']} text(s) hold U+2581)")
        for m in r["mismatches"]:
            print("  MISMATCH", json.dumps(m, ensure_ascii=False))
        failed |= any(r[k] != n for k in ("ids", "ids_bos", "decoded", "tokenizers_ids"))
        failed |= r["bos_token_id"] != 1 or r["eos_token_id"] != 2
    if not results:
        sys.exit(f"no *.ids.json in {sys.argv[1]}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "hf_tokenizer_check.json"), "w", encoding="utf-8") as f:
            json.dump({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                       "results": results}, f, indent=1, ensure_ascii=False)
    print("MISMATCH" if failed else "MATCH")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
