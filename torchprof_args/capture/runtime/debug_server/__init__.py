"""PyTorch's debug server with this package's pages: :mod:`.server` starts and stops it, :mod:`.pages`
are the pages registered beside PyTorch's."""
