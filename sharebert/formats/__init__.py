"""Files and folders: model folders (``model_folder``, ``build``), the sentence-transformers recipe (``recipe``),
WordPiece tokenizers (``tokenization``), where the data lives (``paths``) and progress bars (``bars``)."""
