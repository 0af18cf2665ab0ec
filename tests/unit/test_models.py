import pytest

from training.errors import ConfigError
from training.train import models


@pytest.mark.parametrize("shape", [(8, 8, 1), (28, 28, 1), (32, 32, 3)])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_builders_take_raw_pixels_and_output_class_probabilities(name, shape):
    model = models.build(name, shape, 10)
    assert model.input.dtype == "uint8"
    assert tuple(model.input.shape[1:]) == shape
    assert tuple(model.output.shape) == (None, 10)
    assert model.layers[1].__class__.__name__ == "Rescaling"


def test_mlp_is_the_seed_model():
    kinds = [layer.__class__.__name__ for layer in models.build("mlp", (28, 28, 1), 10).layers]
    assert kinds == ["InputLayer", "Rescaling", "Flatten", "Dense", "Dropout", "Dense"]


def test_cnn_is_the_seed_cifar_network_layer_for_layer():
    model = models.build("cnn", (32, 32, 3), 10)
    kinds = [layer.__class__.__name__ for layer in model.layers][2:]
    block = ["Conv2D", "BatchNormalization", "Conv2D", "BatchNormalization", "MaxPooling2D",
             "Dropout"]
    assert kinds == block + block + ["Flatten", "Dense", "BatchNormalization", "Dropout",
                                     "Dense"]
    convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    assert [c.filters for c in convs] == [32, 32, 64, 64]
    assert [c.padding for c in convs] == ["same", "valid", "same", "valid"]
    drops = [layer.rate for layer in model.layers if layer.__class__.__name__ == "Dropout"]
    assert drops == [0.25, 0.25, 0.5]


def test_unknown_model_is_a_config_error():
    with pytest.raises(ConfigError, match="model.name 'nope' is not a model: built in mlp, "
                                          "cnn; installed"):
        models.build("nope", (8, 8, 1), 10)


def test_registering_a_model_is_one_function():
    @models.register("tiny_for_test")
    def tiny(input_shape, num_classes):
        import keras

        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(
            inputs)))

    try:
        assert models.build("tiny_for_test", (4, 4, 1), 3).output.shape[-1] == 3
        with pytest.raises(ValueError, match="already registered"):
            models.register("tiny_for_test")(tiny)
    finally:
        del models.MODELS["tiny_for_test"]
