# Generates variant_cases.json: tokenizer.json variants that exercise the stages and options the four
# fixture tokenizers (tests/fixtures/tokenizers) do not (Split behaviours and invert, NFC, Replace, added-token flags, ignore_merges,
# legacy merges, subword prefix/suffix, unknown tokens, other decoders and post-processors), with the
# ids and decodes that Hugging Face `tokenizers` gives for them. The C++ test applies each variant's
# patch to its base fixture and compares.
#
# Run: python3 make_variant_cases.py tests/fixtures/tokenizers  (needs `pip install tokenizers`)
import json, os, sys
import tokenizers
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, Regex

fixtures = sys.argv[1]
def base(name):
    with open(os.path.join(fixtures, name + ".json")) as f:
        return json.load(f)

TEXTS = ["Hello, world! How are you?", "<s>x y</s> z", "  lead", "</s> after special", "  two  spaces\tand\ttabs\n\nnew lines  ", "numbers 1234567 and 3.14159",
         "caf\u00e9 vs cafe\u0301 \u212b \ufb01", "\u4f60\u597d\u4e16\u754c \U0001F600 done", "I'm sure they'll say WE'VE done it",
         "<tool>call</tool> <tool> spaced </tool>", "hello world, shello hello_x hello", "x<|im_end|>y <|im_end|> z",
         "", " ", "a", "ALL CAPS, lower; mixed.Case!", "foo bar foo-bar foobar", "[MASK] the [MASK]", "\u00a0nbsp\u00a0"]

BYTELEVEL_NO_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
def split(pattern, behavior, invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern}, "behavior": behavior, "invert": invert}
def seq(*stages):
    return {"type": "Sequence", "pretokenizers": list(stages)}
def added(id, content, special=False, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": id, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}

variants = []
def variant(name, base_name, patch):
    variants.append((name, base_name, patch))

variant("split_removed", "gpt2-bytelevel", {"pre_tokenizer": seq(split(r"\s+", "Removed"), BYTELEVEL_NO_REGEX)})
variant("split_merged_with_previous", "gpt2-bytelevel", {"pre_tokenizer": seq(split(" ", "MergedWithPrevious", literal=True), BYTELEVEL_NO_REGEX)})
variant("split_merged_with_next", "gpt2-bytelevel", {"pre_tokenizer": seq(split(r"[,.!?;]", "MergedWithNext"), BYTELEVEL_NO_REGEX)})
variant("split_contiguous", "gpt2-bytelevel", {"pre_tokenizer": seq(split(r"\d", "Contiguous"), BYTELEVEL_NO_REGEX)})
variant("split_invert_isolated", "gpt2-bytelevel", {"pre_tokenizer": seq(split(r"\p{L}+", "Isolated", invert=True), BYTELEVEL_NO_REGEX)})
variant("split_invert_removed", "gpt2-bytelevel", {"pre_tokenizer": seq(split(r"\p{L}+", "Removed", invert=True), BYTELEVEL_NO_REGEX)})
variant("bytelevel_add_prefix_space", "gpt2-bytelevel", {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}})
variant("bytelevel_no_regex", "gpt2-bytelevel", {"pre_tokenizer": BYTELEVEL_NO_REGEX})
variant("digits_grouped", "gpt2-bytelevel", {"pre_tokenizer": seq({"type": "Digits", "individual_digits": False}, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True})})
variant("nfc", "gpt2-bytelevel", {"normalizer": {"type": "NFC"}})
variant("nfkc_replace", "gpt2-bytelevel", {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "}]}})
variant("added_tokens_flags", "gpt2-bytelevel", {"added_tokens_extra": [
    added(2048, "<tool>", special=True, lstrip=True, rstrip=True), added(2049, "</tool>", special=True),
    added(2050, "hello", single_word=True), added(2051, "[MASK]", special=False, lstrip=True, normalized=False)]})
variant("ignore_merges", "gpt2-bytelevel", {"model_patch": {"ignore_merges": True}})
variant("legacy_merges", "llama3-regex", {"legacy_merges": True})
variant("template_suffix_and_sequence", "gpt2-bytelevel", {"post_processor": {"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
    {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
     "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
     "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}, "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}}}]}})
variant("roberta_processing", "gpt2-bytelevel", {"post_processor": {"type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1], "trim_offsets": True, "add_prefix_space": False}})
variant("sp_unknown_fused", "sentencepiece-bpe", {"model_patch": {"byte_fallback": False, "fuse_unk": True}})
variant("sp_unknown_unfused", "sentencepiece-bpe", {"model_patch": {"byte_fallback": False, "fuse_unk": False}})
variant("sp_normalized_added_token", "sentencepiece-bpe", {"added_tokens_extra": [added(2056, "foo", special=False, normalized=True), added(2057, "\u2581bar", special=False, normalized=True)]})
variant("sp_strip_both_ends", "sentencepiece-bpe", {"decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"Regex": "\u2581+"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 1}]}})

def metaspace(scheme, split, legacy=False):
    if legacy:
        return {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": scheme == "always"}
    return {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
for scheme in ("first", "always", "never"):
    for split in (False, True):
        variant(f"metaspace_{scheme}_{'split' if split else 'nosplit'}", "sentencepiece-bpe",
                {"normalizer": None, "pre_tokenizer": metaspace(scheme, split), "decoder": metaspace(scheme, split)})
variant("metaspace_legacy_add_prefix_space", "sentencepiece-bpe",
        {"normalizer": None, "pre_tokenizer": metaspace("always", True, legacy=True),
         "decoder": {"type": "Sequence", "decoders": [metaspace("always", True, legacy=True), {"type": "ByteFallback"}, {"type": "Fuse"}]}})

def patched(base_name, patch):
    j = base(base_name)
    for key in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
        if key in patch: j[key] = patch[key]
    if "added_tokens_extra" in patch: j["added_tokens"] = j["added_tokens"] + patch["added_tokens_extra"]
    if "model_patch" in patch: j["model"].update(patch["model_patch"])
    if patch.get("legacy_merges"): j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    return j

def cases_for(tok):
    rows = []
    for s in TEXTS:
        e0 = tok.encode(s, add_special_tokens=False).ids
        e1 = tok.encode(s, add_special_tokens=True).ids
        try:
            rows.append({"text": s, "ids": e0, "ids_with_special": e1, "decoded": tok.decode(e0, skip_special_tokens=False),
                         "decoded_skip_special": tok.decode(e1, skip_special_tokens=True)})
        except BaseException:  # tokenizers' Strip decoder panics on an empty text with stop > 0
            pass
    return rows

out = {"tokenizers_version": tokenizers.__version__, "variants": []}
for name, base_name, patch in variants:
    tok = Tokenizer.from_str(json.dumps(patched(base_name, patch)))
    out["variants"].append({"name": name, "base": base_name, "patch": patch, "cases": cases_for(tok)})

# A model with a continuing-subword prefix and an end-of-word suffix needs its own vocabulary.
t = Tokenizer(models.BPE(continuing_subword_prefix="##", end_of_word_suffix="</w>", unk_token="[UNK]"))
t.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), behavior="removed")
tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], continuing_subword_prefix="##", end_of_word_suffix="</w>", show_progress=False)
t.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 20 + TEXTS, tr)
out["variants"].append({"name": "subword_prefix_suffix", "base": None, "patch": {"full": json.loads(t.to_str())}, "cases": cases_for(t)})

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "variant_cases.json"), "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=0)
print(len(out["variants"]), "variants")
