"""Embeds blocks of text into the retrieval space with a `RealmEmbedder`, in batches."""

from collections.abc import Sequence

import torch

from ..precision import autocast, resolve_precision


def _block_features(tokenizer, texts: Sequence[str], titles: Sequence[str] | None, max_length: int) -> list[dict]:
    """One unpadded feature dict per block, `[CLS] title [SEP] text [SEP]` or `[CLS] text [SEP]` (no title)."""
    texts = list(texts)
    if titles is not None and len(titles) != len(texts):
        raise ValueError(f"titles must give one title per block: expected {len(texts)}, got {len(titles)}.")
    titled = [index for index in range(len(texts)) if titles is not None and titles[index]]
    untitled = [index for index in range(len(texts)) if not (titles is not None and titles[index])]
    features: list[dict | None] = [None] * len(texts)
    if titled:
        encoded = tokenizer([titles[i] for i in titled], [texts[i] for i in titled], truncation=True,
                            max_length=max_length)  # fmt: skip
        for position, index in enumerate(titled):
            features[index] = {key: encoded[key][position] for key in encoded}
    if untitled:
        encoded = tokenizer([texts[i] for i in untitled], truncation=True, max_length=max_length)
        for position, index in enumerate(untitled):
            features[index] = {key: encoded[key][position] for key in encoded}
    return features


def encode_blocks(tokenizer, texts: Sequence[str], titles: Sequence[str] | None = None, max_length: int = 288) -> dict:
    """Tokenizes blocks as `[CLS] title [SEP] text [SEP]`, or `[CLS] text [SEP]` where the title is empty or absent
    (the REALM Hub corpus has no titles), padded to the longest block of the batch."""
    return tokenizer.pad(_block_features(tokenizer, texts, titles, max_length), padding=True, return_tensors="pt")


@torch.no_grad()
def embed_blocks(
    embedder,
    tokenizer,
    texts: Sequence[str],
    titles: Sequence[str] | None = None,
    batch_size: int = 128,
    max_length: int = 288,
    precision: str = "fp32",
) -> torch.Tensor:
    r"""
    Embeds blocks with `embedder` in eval mode (see `encode_blocks` for the input layout).

    Args:
        embedder (`RealmEmbedder`): the block encoder (for `RealmForOpenQA`, `model.embedder`).
        tokenizer (`RealmTokenizer`): the model's tokenizer.
        texts (`Sequence[str]`): block texts. titles (`Sequence[str]`, *optional*): one title per block.
        batch_size (`int`, defaults to 128), max_length (`int`, defaults to 288): batching and truncation.
        precision (`str`, defaults to "fp32"): "bf16" runs the embedder under bf16 autocast (the embeddings come
            back in fp32), "auto" picks bf16 where the device has native bf16 (`realm_hf.precision`).

    Returns:
        `torch.FloatTensor` of shape `(len(texts), config.retriever_proj_size)` on the CPU.
    """
    if titles is not None and len(titles) != len(texts):
        raise ValueError(f"titles must give one title per block: expected {len(texts)}, got {len(titles)}.")
    features = _block_features(tokenizer, texts, titles, max_length)
    # Batches of similar lengths (longest first) waste little on padding: on a corpus of mixed 30- and 130-word
    # passages this embeds several times faster than batches in corpus order. Rows go back to corpus order below.
    order = sorted(range(len(features)), key=lambda index: -len(features[index]["input_ids"]))
    precision = resolve_precision(precision, embedder.device)
    was_training = embedder.training
    embedder.eval()
    chunks = []
    try:
        with autocast(precision, embedder.device):
            for start in range(0, len(order), batch_size):
                batch = [features[index] for index in order[start : start + batch_size]]
                encoded = tokenizer.pad(batch, padding=True, return_tensors="pt")
                encoded = {key: value.to(embedder.device) for key, value in encoded.items()}
                chunks.append(embedder(**encoded).projected_score.float().cpu())
    finally:
        embedder.train(was_training)
    if not chunks:
        return torch.empty(0, embedder.config.retriever_proj_size)
    embeddings = torch.empty(len(order), chunks[0].shape[1], dtype=chunks[0].dtype)
    embeddings[torch.tensor(order)] = torch.cat(chunks)
    return embeddings
