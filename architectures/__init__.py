"""Built-in architectures; importing this package registers them."""
from architectures import torchvision_models, transformer  # noqa: F401  (registration side effects)
