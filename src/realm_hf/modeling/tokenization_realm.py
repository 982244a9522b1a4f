"""REALM tokenizer: BERT wordpiece plus `batch_encode_candidates` for (batch, num_candidates, seq_len) inputs."""

import os

from transformers import BatchEncoding, BertTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "vocab.txt", "tokenizer_file": "tokenizer.json"}


class RealmTokenizer(BertTokenizer):
    r"""
    The REALM tokenizer: uncased BERT wordpiece (`[CLS] A [SEP] B [SEP]`, token types 0 then 1).

    Transformers 5 has one tokenizer implementation per model (the Rust backend), so `RealmTokenizerFast` is the same
    class. Unlike `BertTokenizer`, `save_pretrained` also writes `vocab.txt`, so the saved directory still loads in
    transformers 4.x.

    Args:
        vocab_file (`str`, *optional*): path of a `vocab.txt` with one wordpiece per line.
        do_lower_case (`bool`, defaults to `True`), tokenize_chinese_chars (`bool`, defaults to `True`),
        strip_accents (`bool`, *optional*): normalisation, as in `BertTokenizer`.
        vocab (`str` or `dict[str, int]`, *optional*): a vocabulary given directly instead of `vocab_file`.
    """

    vocab_files_names = VOCAB_FILES_NAMES

    def __init__(
        self,
        vocab_file: str | None = None,
        do_lower_case: bool = True,
        do_basic_tokenize: bool = True,
        never_split: list[str] | None = None,
        unk_token: str = "[UNK]",
        sep_token: str = "[SEP]",
        pad_token: str = "[PAD]",
        cls_token: str = "[CLS]",
        mask_token: str = "[MASK]",
        tokenize_chinese_chars: bool = True,
        strip_accents: bool | None = None,
        vocab: str | dict[str, int] | None = None,
        **kwargs,
    ):
        # `do_basic_tokenize` and `never_split` only existed in the slow 4.x tokenizer; the Rust backend always
        # splits on whitespace and punctuation first, which is what every REALM checkpoint uses.
        # A tokenizer.json given alone holds the vocabulary (BertTokenizer loads it, as 4.x's fast tokenizer did); given
        # with a vocabulary, the vocabulary wins, as it always has here.
        if vocab is not None or vocab_file is not None:
            kwargs.pop("tokenizer_file", None)
        super().__init__(
            vocab=vocab if vocab is not None else vocab_file,
            do_lower_case=do_lower_case,
            unk_token=unk_token,
            sep_token=sep_token,
            pad_token=pad_token,
            cls_token=cls_token,
            mask_token=mask_token,
            tokenize_chinese_chars=tokenize_chinese_chars,
            strip_accents=strip_accents,
            **kwargs,
        )

    def batch_encode_candidates(self, text, **kwargs) -> BatchEncoding:
        r"""
        Encodes a batch of candidate lists, padded to `max_length`, into `(batch_size, num_candidates, max_length)`.

        Unlike transformers 4.x, over-long candidates are truncated to `max_length` unless `truncation=False` is passed
        explicitly.

        Args:
            text (`list[list[str]]`): `text[i]` holds the candidates of batch element `i`; every element must have the
                same number of candidates.
            text_pair (`list[list[str]]`, *optional*): second segments, same nesting as `text`.
            return_tensors (`str`, *optional*): "pt", "np", or `None` for nested lists.
            **kwargs: passed to the tokenizer call (`max_length`, `truncation`, ...). `padding` is always "max_length".

        Example:

        ```python
        >>> candidates = [["Hello world!", "Nice to meet you!"], ["The cute cat.", "The adorable dog."]]
        >>> batch = tokenizer.batch_encode_candidates(candidates, max_length=10, return_tensors="pt")
        >>> batch.input_ids.shape
        torch.Size([2, 2, 10])
        ```
        """
        kwargs["padding"] = "max_length"
        kwargs.setdefault("truncation", True if kwargs.get("max_length") is not None else False)
        text_pair = kwargs.pop("text_pair", None)
        return_tensors = kwargs.pop("return_tensors", None)
        if text_pair is not None and len(text_pair) != len(text):
            raise ValueError(
                f"text_pair must have one candidate list per batch element: expected {len(text)}, got {len(text_pair)}."
            )
        counts = {len(candidates) for candidates in text}
        if len(counts) > 1 and return_tensors is not None:
            raise ValueError(
                f"every batch element needs the same number of candidates to build tensors, got {sorted(counts)}."
            )

        output = {"input_ids": [], "attention_mask": [], "token_type_ids": []}
        for index, candidates in enumerate(text):
            pairs = text_pair[index] if text_pair is not None else None
            encoded = super().__call__(candidates, pairs, return_tensors=None, **kwargs)
            for key in output:
                value = encoded.get(key)
                if value is not None:
                    output[key].append(value)
        output = {key: value for key, value in output.items() if len(value) > 0}
        return BatchEncoding(output, tensor_type=return_tensors)

    def _save_pretrained(self, save_directory, file_names, legacy_format=None, filename_prefix=None):
        # Transformers 5 writes only tokenizer.json; 4.x REALM (and every Hub REALM repo) reads vocab.txt.
        file_names = super()._save_pretrained(
            save_directory, file_names, legacy_format=legacy_format, filename_prefix=filename_prefix
        )
        vocab_path = os.path.join(
            str(save_directory), (filename_prefix + "-" if filename_prefix else "") + "vocab.txt"
        )
        with open(vocab_path, "w", encoding="utf-8") as writer:
            for token, _ in sorted(self.get_vocab().items(), key=lambda item: item[1]):
                writer.write(token + "\n")
        return tuple(file_names) + (vocab_path,)


RealmTokenizerFast = RealmTokenizer

__all__ = ["RealmTokenizer", "RealmTokenizerFast"]
