"""Local stacks for trying the product on one machine: not part of the installed product."""
